"""The string-level cross-vocabulary drafter with real GGUF files: SmolLM2-135M (byte-level BPE) and
Gemma-3-270M (SentencePiece, byte fallback) drafting their own text for the Qwen2.5-Coder-1.5B Q4_K_M
verifier, greedy: each emitted token is the verifier's argmax for exactly its context (test_backend's
check, step by step: llama.cpp is not batch-invariant), over 150 tokens of deeply indented code, prose,
and text with emoji and CJK characters. One runs by default; the rest are `slow`."""

from __future__ import annotations

import json

import pytest

from specgguf.core.string_drafter import StringDrafter
from specgguf.drafts.cross_vocab import cross_vocab
from specgguf.llama.model import LlamaModel
from test_backend import RecordingModel
from test_cross_vocab_gguf import greedy_events

PROMPTS = {
    "code": (
        "class Tree:\n    def walk(self, node, depth=0):\n        for child in node.children:\n"
        "            if child.visible:\n                for leaf in child.leaves():\n"
        "                    if leaf.weight > depth:\n                        "
    ),
    "prose": "The history of the printing press is a story of craftsmen, merchants and readers. In",
    "emoji-cjk": "Notes (笔记) 🎉: 我喜欢编程，Python 很有趣 🐍。東京の天気は晴れ ☀️. Next, in Chinese: 今天",
}
N_TOKENS = 150


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory):
    """Vocabulary maps go to a cache of this module's own, built once for its tests (the models stay
    where the fixtures put them; tests/test_cross_vocab_gguf.py builds a map afresh)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECGGUF_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def _greedy_per_step(verifier_path, draft_path, prompt):
    verifier = RecordingModel(LlamaModel(verifier_path, n_ctx=512))
    draft = LlamaModel(draft_path, n_ctx=512)
    cross = cross_vocab(draft, verifier.model, "string")
    assert cross.verifier_text is not None
    drafter = StringDrafter(draft, cross, cross.verifier_text)
    events, output = greedy_events(verifier, drafter, prompt, max_tokens=N_TOKENS)
    # All of it, or the verifier ended its answer (where depends on the CPU's numerics: the prose
    # prompt's answer ends after 136 tokens on an AVX-512 machine).
    assert len(output) == N_TOKENS or (len(output) < N_TOKENS and events[-1].stop == "eos")
    n_drafted, n_accepted = sum(e.n_drafted for e in events), sum(e.n_accepted for e in events)
    assert 0 < n_accepted <= n_drafted  # its own text, re-encoded, was proposed and kept
    assert all(event.draft_text_seconds >= 0.0 for event in events)
    verifier.model.close()
    draft.close()


@pytest.mark.parametrize(
    "draft_file, kind",
    [
        ("smollm2", "code"),
        pytest.param("smollm2", "prose", marks=pytest.mark.slow),
        pytest.param("smollm2", "emoji-cjk", marks=pytest.mark.slow),
        pytest.param("gemma270m", "code", marks=pytest.mark.slow),
        pytest.param("gemma270m", "prose", marks=pytest.mark.slow),
        pytest.param("gemma270m", "emoji-cjk", marks=pytest.mark.slow),
    ],
)
def test_its_own_text_re_encoded_decodes_as_the_verifier_does(draft_file, kind, qwen_pair, request):
    _greedy_per_step(qwen_pair[0], request.getfixturevalue(draft_file), PROMPTS[kind])


def test_run_drafts_its_own_text_with_cross_mode_string(cli, tiny_verifier, smollm2):
    args = ("run", "-m", str(tiny_verifier), "-md", str(smollm2), "--temp", "0", "-n", "20", "-k", "3", "--json")
    result = cli(*args, "--drafter", "model", "--cross-mode", "string", "hi")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["n_tokens"] == 20
    assert report["settings"]["draft_variant"]["why"].startswith(
        "another vocabulary: it drafts through the text (string-level: its own text, re-encoded by the verifier)"
    )
    refused = cli(*args, "--cross-mode", "strings", "hi")
    assert refused.error_line() == "specgguf: error: --cross-mode must be one of auto, tokens, string, not 'strings'"


def _stored_k(config, verifier, draft) -> bool:
    from specgguf.tuning import pair_key

    path = config / "specgguf" / "tuning.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    return any(pair_key(verifier, draft) in pairs for pairs in data.values() if isinstance(pairs, dict))


@pytest.mark.parametrize("mode", ["string", "tokens"])
def test_bench_runs_a_cross_mode_and_reports_its_text_round_trip(cli, tiny_verifier, smollm2, tmp_path, mode):
    result = cli(
        "bench", "-m", tiny_verifier, "-md", smollm2, "--quick", "-n", "8", "-k", "3", "--no-adaptive", "--json",
        "--cross-mode", mode, env={"XDG_CONFIG_HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (pair,) = json.loads(result.stdout)["results"]
    assert ("string-level" in pair["draft_variant"]["why"]) == (mode == "string")
    drafted = [row for row in pair["settings"] if row["k"] != 0]
    assert drafted and all(row["draft_text_ms_per_step"] >= 0.0 for row in drafted)
    if mode == "tokens":
        assert all(row["draft_text_ms_per_step"] == 0.0 for row in drafted)
    # `-k auto` reads one K per pair, the mode run drafts in: only a bench in that mode (auto) stores it.
    assert not _stored_k(tmp_path, tiny_verifier, smollm2)
