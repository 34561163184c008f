"""Transcript tests of the `specgguf` command on real GGUF files: in-process (the `cli` fixture), and as a
real process where a pipe or a terminal is what is tested."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys

import pytest

SPECGGUF = [sys.executable, "-m", "specgguf"]


@pytest.fixture(scope="module")
def tiny(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256"]


def test_prompt_from_argument_and_from_stdin_give_the_same_greedy_answer(cli, tiny):
    by_argument = cli("run", *tiny, "--temp", "0", "-n", "30", "-k", "3", "the cat was")
    by_stdin = cli("run", *tiny, "--temp", "0", "-n", "30", "-k", "3", stdin="the cat was")
    assert by_argument.returncode == 0, by_argument.stderr
    assert by_argument.stdout.strip() and by_argument.stdout == by_stdin.stdout
    assert "\x1b" not in by_argument.stdout  # piped: plain text only
    assert "tok/s" in by_argument.stderr and "acceptance" in by_argument.stderr


def test_json_output(cli, tiny):
    result = cli("run", *tiny, "--temp", "0", "-n", "25", "--seed", "3", "-k", "3", "--json", "the dog")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["n_tokens"] == 25 and report["stop_reason"] == "max_tokens"
    assert 0.0 <= report["acceptance_rate"] <= 1.0 and report["tokens_per_second"] > 0
    assert 1.0 <= report["tokens_per_step"] <= 4.0
    assert report["settings"]["draft_max"] == 3 and report["settings"]["seed"] == 3
    assert report["settings"]["temperature"] == 0.0
    assert report["settings"]["drafter"] == "hybrid"  # the default: n-gram drafts on long matches, else the model
    plain = cli("run", *tiny, "--temp", "0", "-n", "25", "-k", "3", "the dog")
    assert plain.stdout.rstrip("\n") == report["text"]
    assert result.stderr == ""  # --json: nothing but the object


def test_k_zero_decodes_with_the_verifier_alone(cli, tiny):
    report = json.loads(cli("run", *tiny, "-k", "0", "--temp", "0", "-n", "12", "--json", "hello").stdout)
    assert report["n_drafted"] == 0 and report["acceptance_rate"] is None and report["tokens_per_step"] == 1.0


def test_sampled_runs_repeat_with_a_seed_and_a_fixed_k(cli, tiny):
    # With a fixed K the random draws happen in the same order; adaptive K follows
    # measured timings, so only its distribution, not its exact sample, repeats.
    first = cli("run", *tiny, "--seed", "5", "-k", "3", "-n", "20", "the cat")
    again = cli("run", *tiny, "--seed", "5", "-k", "3", "-n", "20", "the cat")
    assert first.returncode == 0 and first.stdout == again.stdout


def test_head_closes_the_pipe_quietly(tiny):
    args = " ".join(f"'{a}'" for a in [*SPECGGUF, "run", *tiny, "--temp", "0", "-n", "200", "--raw", "the"])
    result = subprocess.run(
        ["bash", "-c", f'set -o pipefail; {args} | head -c 5; echo " rc=${{PIPESTATUS[0]}}"'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "rc=0" in result.stdout
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def _run_in_terminal(args, env_extra):
    """Run under a pseudo-terminal and return everything it printed."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(env_extra)
        os.execv(sys.executable, [*SPECGGUF, *map(str, args)])
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        try:
            data = os.read(fd, 4096) if ready else b""
        except OSError:
            data = b""
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode("utf-8", "replace")


def test_terminal_output_is_coloured_unless_no_color(tiny):
    args = ["run", *tiny, "--temp", "0", "-n", "30", "--show-rejected", "the cat was"]
    coloured = _run_in_terminal(args, {"TERM": "xterm-256color"})
    assert "\x1b[32m" in coloured  # accepted drafts in green
    assert "rejected draft" in coloured  # the legend, on stderr
    plain = _run_in_terminal(args, {"TERM": "xterm-256color", "NO_COLOR": "1"})
    assert "\x1b[32m" not in plain and "tok/s" in plain


@pytest.mark.slow
@pytest.mark.qwen
def test_default_pair_needs_no_model_options(cli, qwen_pair):
    result = cli("run", "--temp", "0", "-n", "16", "--json", "Write hello world in Python.")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["pair"] == "qwen2.5-coder-1.5b" and report["n_tokens"] == 16
    assert report["settings"]["model"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, tiny_verifier):
    folder = tmp_path_factory.mktemp("bad")
    (folder / "notes.gguf").write_text("not a model")
    (folder / "half.gguf").write_bytes(tiny_verifier.read_bytes()[:400_000])
    return folder


BAD_INPUTS = {
    "missing file": (["-m", "{bad}/nope.gguf", "hi"], "no such file"),
    "not a GGUF": (["-m", "{bad}/notes.gguf", "hi"], "not a GGUF file"),
    "truncated GGUF": (["-m", "{bad}/half.gguf", "hi"], "could not load"),
    "empty prompt": (["-m", "{verifier}", "-md", "{draft}", "   "], "prompt is empty"),
    "prompt longer than the context": (
        ["-m", "{verifier}", "-md", "{draft}", "-c", "16", "the " * 40],
        "context holds 16",
    ),
    "non-numeric K": (["-k", "many", "hi"], "-k/--draft-max takes a number, 'auto' or 'adaptive'"),
    "negative K": (["-k", "-1", "hi"], "between 0 and 64"),
    "unknown drafter": (["--drafter", "oracle", "hi"], "--drafter must be one of"),
    "negative temperature": (["--temp", "-0.5", "hi"], "--temp"),
    "top-p above 1": (["--top-p", "1.5", "hi"], "--top-p"),
    "unknown option": (["--tempo", "1", "hi"], "No such option"),
    "-md without -m": (["-md", "{draft}", "hi"], "needs -m"),
    "unknown pair": (["--pair", "nonesuch", "hi"], "no pair named"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_a_nonzero_exit(cli, case, bad_files, tiny_verifier, tiny_draft, smollm2):
    args, expected = BAD_INPUTS[case]
    args = [a.format(bad=bad_files, verifier=tiny_verifier, draft=tiny_draft, smollm2=smollm2) for a in args]
    result = cli("run", *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specgguf: error: "), result.stderr
    assert expected in lines[0] and "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--prompts", "edit,essays"], "--prompts takes code, prose, edit, chat, summary, repeat, got 'edit,essays'"),
        (["--prompts", ","], "--prompts takes"),
        (["--drafters", "model,oracle"], "--drafters must be one of"),
    ],
)
def test_bad_bench_options_are_one_line_errors(cli, args, expected):
    result = cli("bench", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"specgguf: error: {expected}") and result.stdout == ""


def test_no_prompt_at_all_is_an_error(cli, tiny):
    result = cli("run", *tiny, stdin="")  # an empty stdin that is not a terminal (/dev/null): the prompt is empty
    assert result.returncode != 0 and result.stderr.startswith("specgguf: error: ")


def test_keep_ngrams_saves_the_session_cache_and_reads_it_back(cli, tiny, tmp_path):
    cache = tmp_path / "cache"
    env = {"SPECGGUF_CACHE": str(cache)}
    args = [*tiny, "--drafter", "ngram", "--keep-ngrams", "-n", "24", "--temp", "0", "-q"]
    first = cli("run", *args, "--raw", "the cat was there and the cat was here", env=env)
    assert first.returncode == 0, first.stderr
    (saved,) = (cache / "ngrams").glob("*.npz")
    learned = saved.stat().st_size
    assert cli("run", *args, "--raw", "a dog ran", env=env).returncode == 0
    assert saved.stat().st_size > learned  # read back, then saved with the new run's n-grams added
    saved.write_bytes(saved.read_bytes()[:100])  # a damaged cache file: one line, and it says what to do
    line = cli("run", *args, "--raw", "a dog ran", env=env).error_line()
    assert str(saved) in line and "delete it" in line


def test_version_prints_the_installed_version_and_exits_0(cli):
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"specgguf {version('specgguf')}\n" and result.stderr == ""
    assert cli("--version", "run").stdout == result.stdout  # eager: before any command runs
