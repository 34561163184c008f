"""`specgguf check DRAFT VERIFIER` on real GGUF files: PyPI models (Qwen, SmolLM2, Gemma) and tiny generated ones."""

from __future__ import annotations

import pytest

from specgguf.cli.check import check_pair
from tiny_gguf import tiny_vocab, write_tiny_llama

N_SPM = len(tiny_vocab("spm"))


@pytest.fixture
def check(cli):
    """`specgguf check ARGS...`, in-process."""
    return lambda *args: cli("check", *args)


def rows(stdout: str) -> dict[str, str]:
    """The report's item lines, by item name: {'vocabulary size': '✗  vocabulary size  verifier ...'}."""
    items = (
        "tokenizer type",
        "special tokens",
        "vocabulary size",
        "token texts",
        "BOS / EOS texts",
        "extra ids",
        "chat template",
    )
    found = {}
    for line in stdout.splitlines():
        for item in items:
            if line[3:].startswith(item):
                found[item] = line
    return found


@pytest.mark.qwen
def test_the_default_pair_is_compatible_by_path_and_by_name(check, qwen_pair):
    verifier, draft = qwen_pair
    by_path = check(draft, verifier)
    assert by_path.returncode == 0, by_path.stderr
    report = rows(by_path.stdout)
    assert report["token texts"].startswith("✓")
    assert "all 151931 shared tokens from id 5 agree" in report["token texts"]
    assert "verifier 151936, draft 151936" in report["vocabulary size"]
    assert "BOS 151643 '<|endoftext|>', EOS 151645 '<|im_end|>'" in report["BOS / EOS texts"]
    assert "✓ these can be paired" in by_path.stdout
    by_name = check("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b")
    assert by_name.returncode == 0 and rows(by_name.stdout) == report
    assert "[pair qwen2.5-coder-1.5b]" in by_name.stdout


@pytest.mark.qwen
def test_smollm2_drafts_for_qwen_through_the_text_and_the_registry_draft_is_suggested(check, qwen_pair, smollm2):
    verifier, _ = qwen_pair
    result = check(smollm2, verifier)
    assert result.returncode == 0 and result.stderr == ""  # `run -m QWEN -md SMOLLM2` drafts through the text
    report = rows(result.stdout)
    assert report["tokenizer type"].startswith("✓")  # both BPE: the type alone does not tell them apart
    assert report["vocabulary size"].startswith("✗") and "verifier 151936, draft 49152" in report["vocabulary size"]
    assert "BOS id: verifier 151643, draft 1" in report["special tokens"]
    assert "token 5: verifier '&', draft '<file_sep>'" in report["token texts"]
    assert (
        "↔ these draft across vocabularies: llama.cpp's rules fail (special tokens, vocabulary size," in result.stdout
    )
    suggestion = result.stdout.strip().splitlines()[-1]
    assert suggestion.startswith(
        "→ the registry's pair 'qwen2.5-coder-1.5b' pairs this verifier with"
        " Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )


@pytest.mark.qwen
def test_gemma_and_qwen_differ_in_tokenizer_type(check, qwen_pair, gemma270m):
    verifier, _ = qwen_pair
    result = check(gemma270m, verifier)
    assert result.returncode == 0 and "↔ these draft across vocabularies" in result.stdout
    report = rows(result.stdout)
    assert report["tokenizer type"] == "✗  tokenizer type   verifier BPE (gpt2), draft SPM (llama)"
    assert "not compared: the tokenizers are of different types" in report["token texts"]
    assert "verifier 151936, draft 262144" in report["vocabulary size"]
    assert "the draft has none" in report["chat template"]  # the 270M base model has no template


def test_smollm2_and_gemma_fail_every_rule(smollm2, gemma270m):
    report = check_pair(draft=gemma270m, verifier=smollm2)
    assert [finding.ok for finding in report.findings] == [False, False, False]
    cross = {note.item: note.detail for note in report.notes}["shared texts"]
    # Most of SmolLM2's 49k texts are among Gemma's 262k (both forms read as bytes: test_cross_vocab_gguf.py).
    assert cross.startswith("94% of the verifier's tokens (") and " of 49152) have a draft token" in cross
    assert report.across_vocabularies and report.pairs
    assert report.suggestions == [
        "no registry pair has this verifier: a draft of the same model family (usually its smallest sibling,"
        " from the same GGUF producer) would share its vocabulary; see `specgguf pairs`"
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_verifier):
    folder = tmp_path_factory.mktemp("check")
    other_template = "{% for m in messages %}### {{ m['content'] }}\n{% endfor %}"
    return {
        "verifier": tiny_verifier,
        "close draft": write_tiny_llama(folder / "close.gguf", base_seed=7, seed=2, noise=0.1),
        "padded by 100": write_tiny_llama(folder / "pad100.gguf", base_seed=7, n_vocab=N_SPM + 100),
        "padded by 200": write_tiny_llama(folder / "pad200.gguf", base_seed=7, n_vocab=N_SPM + 200),
        "one token differs": write_tiny_llama(folder / "token.gguf", base_seed=7, token_text_override={300: "zzz"}),
        "other EOS": write_tiny_llama(folder / "eos.gguf", base_seed=7, eos_id=0),
        "other template": write_tiny_llama(folder / "template.gguf", base_seed=7, chat_template=other_template),
        "no template": write_tiny_llama(folder / "none.gguf", base_seed=7, chat_template=None),
        "bpe": write_tiny_llama(folder / "bpe.gguf", base_seed=7, vocab_type="bpe"),
    }


TINY_CASES = {  # draft -> (the report line that explains it; a ✗ rule: `run` drafts through the text)
    "close draft": ("chat template", "·  chat template    identical"),
    "padded by 100": ("extra ids", f"ids {N_SPM}..{N_SPM + 99} exist only in the draft"),
    "padded by 200": (
        "vocabulary size",
        f"✗  vocabulary size  verifier {N_SPM}, draft {N_SPM + 200} (differ by 200; at most 128 allowed)",
    ),
    "one token differs": ("token texts", "✗  token texts      1 tokens differ, e.g. token 300:"),
    "other EOS": ("special tokens", "✗  special tokens   EOS id: verifier 2, draft 0"),
    "other template": ("chat template", "they differ (from line 1:"),
    "no template": ("chat template", "the draft has none"),
    "bpe": ("tokenizer type", "✗  tokenizer type   verifier SPM (llama), draft BPE (gpt2)"),
}


@pytest.mark.parametrize("case", TINY_CASES)
def test_each_rule_on_tiny_files(check, case, tiny):
    item, expected = TINY_CASES[case]
    result = check(tiny[case], tiny["verifier"])
    assert result.returncode == 0, result.stdout + result.stderr  # `run -md` takes every one of them
    assert rows(result.stdout)[item].startswith(expected) or expected in rows(result.stdout)[item]
    across = expected.startswith("✗")
    assert ("✓ these can be paired" in result.stdout) == (not across)
    assert ("↔ these draft across vocabularies" in result.stdout) == across
    assert "✗ these cannot be paired" not in result.stdout


def test_a_pair_of_two_vocabularies_is_told_to_draft_through_the_text_not_refused(check, tiny):
    """`run -m VERIFIER -md DRAFT` drafts across the vocabularies; check said "✗ these cannot be paired"."""
    result = check(tiny["bpe"], tiny["verifier"])
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = [line for line in result.stdout.splitlines() if line.startswith("↔")]
    assert verdict == [
        "↔ these draft across vocabularies: llama.cpp's rules fail (tokenizer type), so `specgguf run` drafts"
        " through the text (the cross-vocabulary drafter), in the mode measured faster here: its own text,"
        " re-encoded by the verifier, or only the 95% of the verifier's tokens that a draft token spells the same"
        " (see `cross mode`)"
    ]
    assert "·  draft variant    a draft of another vocabulary is used as given" in result.stdout
    assert "·  cross mode       not measured here yet: `specgguf run` measures" in result.stdout


def test_a_pair_that_shares_no_token_text_cannot_be_paired(tiny):
    import dataclasses
    import io

    from rich.console import Console

    from specgguf.cli.check import render_report

    report = dataclasses.replace(check_pair(draft=tiny["bpe"], verifier=tiny["verifier"]), overlap=0.0)
    assert not report.pairs  # exit status 1
    out = io.StringIO()
    render_report(report, Console(file=out, width=400, highlight=False))
    assert (
        "✗ these cannot be paired: 1 of 3 rules fail (tokenizer type), and no verifier token has a draft token"
        " with the same text"
    ) in out.getvalue()


def test_a_verifier_without_a_chat_template_is_flagged(tiny):
    report = check_pair(draft=tiny["verifier"], verifier=tiny["no template"])
    template = next(note for note in report.notes if note.item == "chat template")
    assert report.compatible and not template.ok and "run with --raw" in template.detail


BAD = {
    "missing file": (["/nonexistent/draft.gguf", "{v}"], "no such file"),
    "not a GGUF": (["{notes}", "{v}"], "not a GGUF file"),
    "unknown pair": (["nonesuch", "{v}"], "nonesuch: no such file, and no pair of that name in the registry"),
    "pair not downloaded": (["qwen3-8b", "qwen3-8b"], "is not downloaded: run `specgguf pull qwen3-8b`"),
    "hub file not pulled": (["{v}", "someone/repo-GGUF/x.gguf"], "not in the Hugging Face cache"),
    "one argument": (["{v}"], "Missing argument 'verifier'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line(check, case, tiny_verifier, tmp_path):
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model")
    args, expected = BAD[case]
    result = check(*[arg.format(v=tiny_verifier, notes=notes) for arg in args])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("specgguf: error: ")
    assert expected in lines[0] and result.stdout == ""
