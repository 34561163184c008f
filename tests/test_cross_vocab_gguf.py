"""Cross-vocabulary drafting with real GGUF files: SmolLM2-135M (byte-level BPE) drafting for
Gemma-3-270M (SentencePiece), each emitted token the verifier's argmax for exactly its context."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgguf.core.cross_drafter import CrossVocabDrafter
from specgguf.core.engine import speculate
from specgguf.core.sampling import SamplingSettings
from specgguf.core.vocab_map import CONTROL, UNUSED
from specgguf.drafts.cross_vocab import cross_vocab, pair_map, vocab_pieces
from specgguf.files.derived import counts_path
from specgguf.files.vocab_maps import vocab_map_path
from specgguf.llama.model import LlamaModel
from test_backend import RecordingModel


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Vocabulary maps go to a cache of the test's own (the models stay where the fixtures put them)."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("model_file", ["smollm2", "gemma270m"])
def test_token_texts_as_bytes_are_llamas_own_pieces(model_file, request):
    """core/vocab_map.py's reading of both forms agrees with llama.cpp's token_to_piece."""
    model = LlamaModel(request.getfixturevalue(model_file), n_ctx=32)
    pieces = vocab_pieces(model.vocab_info())
    text_tokens = [t for t, kind in enumerate(pieces.kinds) if kind not in (CONTROL, UNUSED)]
    assert len(text_tokens) > 0.9 * len(pieces.kinds)
    assert [pieces.pieces[t] for t in text_tokens] == [model.token_bytes(t) for t in text_tokens]
    model.close()


def greedy_events(verifier: RecordingModel, drafter, prompt: str, *, max_tokens: int):
    """Greedy through `speculate` at K 4; asserts each emitted token is the verifier's argmax for exactly
    its context (the logits it recorded for it). Returns (events, emitted tokens)."""
    prompt_tokens = verifier.tokenize(prompt, special=False)
    events = list(
        speculate(
            verifier=verifier,
            drafter=drafter,
            prompt_tokens=prompt_tokens,
            k=4,
            max_tokens=max_tokens,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )
    )
    output = [token for event in events for token in event.tokens]
    scored = {tuple(context): row for context, row in verifier.rows}
    context = list(prompt_tokens)
    for token in output:
        assert token == int(np.argmax(scored[tuple(context)])), f"token after {len(context)} tokens"
        context.append(token)
    return events, output


def _greedy_per_step(verifier_path, draft_path, prompt, *, max_tokens):
    """Each emitted token is the verifier's argmax for exactly its context (test_backend's check:
    llama.cpp is not batch-invariant, so each step against its own logits); drafts kept and refused."""
    verifier = RecordingModel(LlamaModel(verifier_path, n_ctx=512))
    draft = LlamaModel(draft_path, n_ctx=512)
    drafter = CrossVocabDrafter(draft, cross_vocab(draft, verifier.model))
    events, output = greedy_events(verifier, drafter, prompt, max_tokens=max_tokens)
    assert len(output) >= 100
    n_drafted, n_accepted = sum(e.n_drafted for e in events), sum(e.n_accepted for e in events)
    assert 0 < n_accepted < n_drafted  # drafts through text, kept and refused
    verifier.model.close()
    draft.close()
    return drafter


PROMPT = "def fibonacci(n):\n    # return the n-th Fibonacci number\n"


def test_smollm2_drafts_for_gemma_greedily_as_gemma_decodes(smollm2, gemma270m):
    drafter = _greedy_per_step(gemma270m, smollm2, PROMPT, max_tokens=120)
    # Gemma has 262k tokens, SmolLM2 49k: most of SmolLM2's text tokens are Gemma's too.
    assert 0.1 < drafter.map.overlap < 49152 / 262144 and drafter.map.shared.mean() > 0.8


@pytest.mark.slow
def test_smollm2_drafts_for_qwen_greedily_as_qwen_decodes(smollm2, qwen_pair):
    drafter = _greedy_per_step(qwen_pair[0], smollm2, PROMPT, max_tokens=100)
    assert 0.2 < drafter.map.overlap < 0.4  # of Qwen's 151k tokens (49k are SmolLM2's)


def vocab_map_covered(draft_path, verifier_path):
    draft, verifier = LlamaModel(draft_path, n_ctx=32).vocab_info(), LlamaModel(verifier_path, n_ctx=32).vocab_info()
    return pair_map(draft, verifier, draft_path=draft_path, verifier_path=verifier_path).verifier_covered


def test_the_map_is_kept_and_a_damaged_one_built_again(smollm2, gemma270m, capsys):
    draft, verifier = LlamaModel(smollm2, n_ctx=32).vocab_info(), LlamaModel(gemma270m, n_ctx=32).vocab_info()
    path = vocab_map_path(smollm2, gemma270m)
    path.unlink(missing_ok=True)
    built = pair_map(draft, verifier, draft_path=smollm2, verifier_path=gemma270m)
    assert path.exists() and capsys.readouterr().err == ""
    kept = pair_map(draft, verifier, draft_path=smollm2, verifier_path=gemma270m)
    assert np.array_equal(kept.to_verifier, built.to_verifier) and capsys.readouterr().err == ""
    wrong = built.to_verifier.copy()
    wrong[5] = verifier.n_vocab  # an id the verifier does not have
    for damage in (wrong, built.to_verifier[:100], built.to_verifier.astype(np.int64)):
        np.save(path, damage)
        again = pair_map(draft, verifier, draft_path=smollm2, verifier_path=gemma270m)
        assert np.array_equal(again.to_verifier, built.to_verifier)
        assert "a damaged vocabulary map" in capsys.readouterr().err
    path.write_bytes(b"\x93NUMPY garbage")
    assert np.array_equal(
        pair_map(draft, verifier, draft_path=smollm2, verifier_path=gemma270m).to_verifier, built.to_verifier
    )
    assert "a damaged vocabulary map" in capsys.readouterr().err
    assert np.array_equal(np.load(path), built.to_verifier)  # stored whole again


def test_run_takes_a_draft_of_another_vocabulary_and_says_so(cli, smollm2, gemma270m):
    """`-md` with another vocabulary: the pair runs, the draft model drafting through text beside the
    n-gram drafts (the default hybrid), and --json says why and how much the vocabularies share."""
    args = ("run", "-m", str(gemma270m), "-md", str(smollm2), "--temp", "0", "-n", "40", "-k", "3", "--json")
    result = cli(*args, "--drafter", "model", "def reverse(text):")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # --cross-mode auto: both modes measured here (once, kept), the pair drafting in the faster.
    head, measured = report["settings"]["draft_variant"]["why"].split("; measured here: ")
    string_level = (
        "another vocabulary: it drafts through the text (string-level: its own text, re-encoded by the verifier),"
    )
    assert head in (
        f"{string_level} 18% of the verifier's tokens shared",
        "another vocabulary: it drafts through the text, 18% of the verifier's tokens shared",
    )
    assert measured.startswith("string-level: " if head.startswith(string_level) else "shared tokens: ")
    assert report["n_tokens"] == 40 and 0 < report["n_accepted"] <= report["n_drafted"]
    assert report["accepted_by_source"] == {"model": report["n_accepted"]}
    # Where the verifier's answers were counted (a hot vocabulary's calibration), their share too.
    written = np.zeros(262144, dtype=np.int64)
    written[[0, 1, 2]] = 3  # <pad>, <eos>, <bos>: control tokens no SmolLM2 token spells
    written[int(np.flatnonzero(vocab_map_covered(smollm2, gemma270m))[0])] = 1
    counts_path(gemma270m).parent.mkdir(parents=True, exist_ok=True)
    np.save(counts_path(gemma270m), written)
    report = json.loads(cli(*args, "--drafter", "model", "def reverse(text):").stdout)
    assert (
        "18% of the verifier's tokens shared, 10% of its answers; measured here: "
        in (report["settings"]["draft_variant"]["why"])
    )
    refused = cli(*args, "--draft-variant", "q4_0", "def reverse(text):")
    assert (
        refused.error_line() == "specgguf: error: --draft-variant q4_0: a draft of another vocabulary is used as given"
    )


def test_a_tiny_verifier_takes_smollm2_as_its_draft(cli, tiny_verifier, smollm2):
    """Once refused as an incompatible pair (test_cli.py's bad inputs), now drafted through text."""
    result = cli(
        "run", "-m", str(tiny_verifier), "-md", str(smollm2), "--temp", "0", "-n", "20", "-k", "3", "--json", "hi"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["n_tokens"] == 20 and report["settings"]["draft_variant"]["why"].startswith("another vocabulary")


def test_the_cross_drafter_on_a_pair_of_one_vocabulary_is_one_error_line(cli, tiny_verifier, tiny_draft):
    result = cli("run", "-m", str(tiny_verifier), "-md", str(tiny_draft), "--drafter", "cross", "-n", "5", "hi")
    assert result.error_line() == (
        "specgguf: error: --drafter cross needs the pair's vocabulary map (a draft of another vocabulary)"
    )
