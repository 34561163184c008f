"""The benchmark suite (bench/suite/suite.yaml) and what `bench --vs-llama-cpp --suite` reports of the machine."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from specgguf.bench import machine
from specgguf.bench.command import make_plan
from specgguf.bench.llama_tools import LlamaTools
from specgguf.bench.suite import KINDS, SuiteError, load_suite, select
from specgguf.bench.vs_llama import vs_plan
from specgguf.cli.app import main
from specgguf.errors import UsageError


def test_the_shipped_suite_has_every_kind_and_a_long_context():
    suite = load_suite()
    assert len(suite) >= 24 and len({p.name for p in suite}) == len(suite)
    kinds = Counter(p.kind for p in suite)
    assert set(kinds) == set(KINDS) and kinds["edit"] >= 4
    # A long context: over 5,000 characters is over 1,500 tokens in any of these vocabularies.
    assert max(len(p.text) for p in suite if p.kind == "long") > 5000
    assert all("Return the whole" in p.text for p in suite if p.kind == "edit")  # edits return all the code


def entry(extra: str = "") -> str:
    return "- name: a\n  kind: code\n  prompt: Write a loop.\n" + extra


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- name: a\n  kind: code\n  promt: Write.\n", "suite.yaml:3: unknown key 'promt'"),
        ("- name: a\n  kind: poetry\n  prompt: Write.\n", "suite.yaml:1: kind 'poetry' is not one of code"),
        (entry() + entry(), "suite.yaml:4: the name 'a' is used twice"),
        ("- name: a\n  kind: code\n", "suite.yaml:1: missing prompt"),
        ("- name: a\n  kind: code\n  prompt: ''\n", "suite.yaml:3: prompt is empty"),
        ("- name: a\n  kind: code\n  prompt: [1, 2]\n", "suite.yaml:3: prompt must be a text"),
        (entry("  attach: notes.txt\n"), "suite.yaml:4: attach must be a list of file names"),
        (entry("  attach: [../../etc/passwd]\n"), "attach takes file names beside the suite file"),
        (entry("  attach: [missing.txt]\n"), "cannot read the attachment 'missing.txt'"),
        ("{}", "expected a list of prompts"),
        ("- [", "not YAML"),
    ],
)
def test_a_typo_in_the_suite_names_its_file_and_line(text, message, tmp_path):
    with pytest.raises(SuiteError, match=None) as raised:
        load_suite(text, source="suite.yaml", read=lambda name: (tmp_path / name).read_text())
    assert message in str(raised.value)


def test_attachments_follow_the_prompt(tmp_path):
    (tmp_path / "one.txt").write_text("first\n")
    (tmp_path / "two.txt").write_text("second\n")
    (suite,) = load_suite(entry("  attach: [one.txt, two.txt]\n"), read=lambda name: (tmp_path / name).read_text())
    assert suite.text == "Write a loop.\n\nfirst\n\nsecond"


def test_a_suite_plan_measures_each_prompt_by_name_with_its_kind():
    plan = make_plan(
        ks="4",
        temps="0",
        drafters="model",
        prompts=None,
        repeats=1,
        max_tokens=16,
        quick=False,
        adaptive=True,
        vs_llama_cpp=True,
    )
    suite = load_suite()
    comparison = vs_plan(plan, suite)
    assert comparison.prompts == [p.name for p in suite] and comparison.machine
    assert comparison.kinds["edit-rename"] == "edit" and "running_average" in comparison.texts["edit-rename"]


def test_suite_needs_the_comparison(capsys):
    assert main(["bench", "-m", "x.gguf", "--suite"]) != 0
    assert "specgguf: error: --suite goes with --vs-llama-cpp DIR" in capsys.readouterr().err
    assert main(["bench", "-m", "x.gguf", "--suite", "--vs-llama-cpp", "/nonexistent"]) != 0
    assert "--vs-llama-cpp /nonexistent: not a directory" in capsys.readouterr().err


@pytest.mark.live  # it runs a stand-in llama-bench
def test_the_machine_report_reads_llama_bench_and_the_cpu(tmp_path):
    for name in ("llama-completion", "llama-speculative-simple", "llama-bench"):
        (tmp_path / name).write_text(
            "#!/bin/sh\n"
            + textwrap.dedent(
                """\
                echo '[{"n_prompt": 1, "avg_ts": 20.0}, {"n_prompt": 2, "avg_ts": 25.0},
                      {"n_prompt": 4, "avg_ts": 40.0}, {"n_prompt": 8, "avg_ts": 64.0}]'
                echo "$@" >&2
                """
            )
        )
        (tmp_path / name).chmod(0o755)
    report = machine.machine_report(LlamaTools.find(tmp_path), [("pair", Path("v.gguf"))], 2)
    assert report["llama_bench"]["pair"] == {1: 20.0, 2: 25.0, 4: 40.0, 8: 64.0}
    assert report["cpu"] and isinstance(report["avx512_vnni"], bool)
    text = machine.machine_lines(report)
    assert "avx512_vnni: " in text and "-t 2" in text
    assert "2 rows 80.0 ms (1.60× one)" in text and "8 rows 125.0 ms (2.50× one)" in text


def test_without_llama_bench_the_report_says_how_to_build_it(tmp_path):
    for name in ("llama-completion", "llama-speculative-simple"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    report = machine.machine_report(LlamaTools.find(tmp_path), [("pair", Path("v.gguf"))], 2)
    assert "no llama-bench beside llama.cpp's programs (make llama-tools builds it)" in machine.machine_lines(report)


def test_prompts_picks_suite_prompts_by_name_or_kind():
    suite = load_suite()
    picked = select(suite, "edit-rename,long")
    assert [p.name for p in picked] == ["edit-rename"] + [p.name for p in suite if p.kind == "long"]
    assert select(suite, None) == suite
    for bad in ("edit-renam", ",", "code,poetry"):
        with pytest.raises(UsageError, match="--prompts with --suite takes the suite's prompt names or kinds"):
            select(suite, bad)
