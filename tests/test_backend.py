"""The llama.cpp backend on real GGUF files: generated tiny models, SmolLM2 and the Qwen pair."""

from __future__ import annotations

import ctypes

import llama_cpp  # tests may read llama.cpp directly, to compare against it
import numpy as np
import pytest

from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.engine import speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings, process_logits
from specgguf.errors import IncompatibleModelsError, ModelLoadError
from specgguf.llama.compat import compare_vocabularies, ensure_compatible
from specgguf.llama.model import LlamaModel
from tiny_gguf import write_tiny_llama

GREEDY = SamplingSettings(temperature=0.0)


class RecordingModel:
    """Wraps a real model and records, for every logits row it returns, the context it scored."""

    def __init__(self, model: LlamaModel):
        self.model = model
        self.rows: list[tuple[list[int], np.ndarray]] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def eval(self, tokens, *, n_logits):
        before = list(self.model.cached)
        logits = self.model.eval(tokens, n_logits=n_logits)
        full = before + list(tokens)
        for i, row in enumerate(logits):
            self.rows.append((full[: len(full) - n_logits + i + 1], row))
        return logits

    def eval_tree(self, tokens, parents, *, n_logits):
        before = list(self.model.cached)
        logits = self.model.eval_tree(tokens, parents, n_logits=n_logits)
        paths: list[list[int]] = []
        for token, parent in zip(tokens, parents):
            paths.append((paths[parent] if parent >= 0 else []) + [token])
        for path, row in zip(paths[len(tokens) - n_logits :], logits):
            self.rows.append((before + path, row))
        return logits

    def keep_path(self, path):
        self.model.keep_path(path)

    def rewind(self, n_past):
        self.model.rewind(n_past)


def _check_greedy_per_step(
    verifier_path,
    draft_path,
    prompt,
    *,
    k,
    max_tokens,
    n_ctx=512,
    verifier_options=None,
    draft_options=None,
    make_drafter=ModelDrafter,
):
    """Every emitted token is the argmax of the verifier's logits for exactly its context.

    llama.cpp is not batch-invariant (a batch of 9 and a batch of 1 give slightly
    different logits), so this checks each step against the verifier's own logits
    in that step, not against a separate plain run byte for byte. The options go
    to each LlamaModel (e.g. RPC workers); both models are closed before returning.
    """
    verifier = RecordingModel(LlamaModel(verifier_path, n_ctx=n_ctx, **(verifier_options or {})))
    draft = LlamaModel(draft_path, n_ctx=n_ctx, **(draft_options or {}))
    tokens = verifier.tokenize(prompt, special=False)
    events = list(
        speculate(
            verifier=verifier,
            drafter=make_drafter(draft),
            prompt_tokens=tokens,
            k=k,
            max_tokens=max_tokens,
            settings=GREEDY,
            rng=np.random.default_rng(0),
        )
    )
    output = [t for event in events for t in event.tokens]
    scored = {tuple(context): row for context, row in verifier.rows}
    context = list(tokens)
    for token in output:
        assert token == int(np.argmax(scored[tuple(context)])), f"token after {len(context)} tokens"
        context.append(token)
    assert verifier.model.cached == context[: verifier.model.n_past]
    assert draft.cached == context[: draft.n_past]
    verifier.model.close()
    draft.close()
    return events, output


def test_tiny_pair_greedy_is_the_verifiers_argmax_each_step(tiny_verifier, tiny_draft):
    events, output = _check_greedy_per_step(tiny_verifier, tiny_draft, "the cat was there", k=4, max_tokens=60)
    assert len(output) == 60
    n_drafted = sum(e.n_drafted for e in events)
    n_accepted = sum(e.n_accepted for e in events)
    assert 0 < n_accepted < n_drafted  # a real mix of accepted and rejected drafts


def test_tiny_pair_reading_guesses_ahead_is_the_verifiers_argmax_each_step(tiny_verifier, tiny_draft):
    # The default hybrid: its draft model reads prompt lookup's guesses ahead in batches of several rows,
    # rewinding its cache where it draws otherwise. Each of its drafts is the draft's argmax for exactly
    # its context (a guess left in the cache would have it score another), and the output the verifier's.
    drafts: list[RecordingModel] = []

    def hybrid(draft):
        drafts.append(RecordingModel(draft))
        return build_drafter("hybrid", drafts[-1], DraftSettings())

    prompt = "the cat was there and the cat was here and the dog was there and the cat"
    events, output = _check_greedy_per_step(tiny_verifier, tiny_draft, prompt, k=6, max_tokens=60, make_drafter=hybrid)
    assert len(output) == 60
    assert sum(e.draft_read_ahead for e in events) > 0  # rows read ahead were drawn from
    rows: dict[tuple[int, ...], list[int]] = {}
    for scored, row in drafts[0].rows:
        rows.setdefault(tuple(scored), []).append(int(np.argmax(row)))
    tokenizer = LlamaModel(tiny_verifier, n_ctx=64)  # the prompt as the helper read it
    context = tokenizer.tokenize(prompt, special=False)
    tokenizer.close()
    n_checked = 0
    for event in events:
        if event.draft_source == "model":
            chain = event.accepted + event.rejected
            for i, token in enumerate(chain):
                assert token in rows[tuple(context + chain[:i])], f"draft {i} after {len(context)} tokens"
                n_checked += 1
        context += event.tokens
    assert n_checked > 10


def test_smollm2_with_itself_accepts_everything_greedily(smollm2):
    events, output = _check_greedy_per_step(smollm2, smollm2, "The capital of France is", k=4, max_tokens=24)
    assert sum(e.n_accepted for e in events) >= 0.9 * sum(e.n_drafted for e in events)


@pytest.mark.slow
@pytest.mark.qwen
def test_default_qwen_pair_end_to_end(qwen_pair):
    verifier, draft = qwen_pair
    events, output = _check_greedy_per_step(verifier, draft, "def fibonacci(n):", k=6, max_tokens=40)
    assert len(output) == 40 and sum(e.n_accepted for e in events) > 0


def test_logits_rows_match_a_full_scoring_and_rewind_restores_state(tiny_verifier):
    tokens = [1, 20, 30, 40, 50, 60]
    partial, full = LlamaModel(tiny_verifier, n_ctx=64), LlamaModel(tiny_verifier, n_ctx=64)
    all_rows = full.eval(tokens, n_logits=len(tokens))
    two_rows = partial.eval(tokens, n_logits=2)
    assert two_rows.shape == (2, partial.n_vocab)
    np.testing.assert_allclose(two_rows, all_rows[-2:], atol=1e-4)
    # Roll back to 3 tokens and go another way: same as scoring that context from scratch.
    partial.rewind(3)
    assert partial.n_past == 3
    fresh = LlamaModel(tiny_verifier, n_ctx=64).eval(tokens[:3] + [99], n_logits=1)
    np.testing.assert_allclose(partial.eval([99], n_logits=1), fresh, atol=1e-4)


def test_prompt_longer_than_a_batch_is_ingested_in_chunks(tiny_verifier):
    model = LlamaModel(tiny_verifier, n_ctx=256, n_batch=32)
    logits = model.eval(list(range(10, 110)), n_logits=3)
    assert model.n_past == 100 and logits.shape == (3, model.n_vocab)


def _llama_cpp_chain_probs(logits: np.ndarray, settings: SamplingSettings) -> np.ndarray:
    """llama.cpp's own top-k -> top-p -> min-p -> temperature chain on one logits row."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for sampler in (
        llama_cpp.llama_sampler_init_top_k(settings.top_k),
        llama_cpp.llama_sampler_init_top_p(settings.top_p, 1),
        llama_cpp.llama_sampler_init_min_p(settings.min_p, 1),
        llama_cpp.llama_sampler_init_temp(settings.temperature),
    ):
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    data = (llama_cpp.llama_token_data * len(logits))(
        *[llama_cpp.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)]
    )
    array = llama_cpp.llama_token_data_array(data, len(logits), -1, False)
    llama_cpp.llama_sampler_apply(chain, ctypes.pointer(array))
    kept = {int(data[i].id): data[i].logit for i in range(array.size)}
    llama_cpp.llama_sampler_free(chain)
    ids = np.array(sorted(kept))
    values = np.array([kept[i] for i in ids], dtype=np.float64)
    probs = np.zeros(len(logits))
    probs[ids] = np.exp(values - values.max()) / np.exp(values - values.max()).sum()
    return probs


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingSettings(temperature=1.5, top_k=0, top_p=0.5, min_p=0.0),
        SamplingSettings(temperature=0.3, top_k=5, top_p=1.0, min_p=0.2),
    ],
)
def test_processed_distribution_matches_llama_cpps_sampler_chain(settings):
    logits = np.random.default_rng(0).normal(scale=3.0, size=300).astype(np.float32)
    ours = process_logits(logits, settings)[0]
    np.testing.assert_allclose(ours, _llama_cpp_chain_probs(logits, settings), atol=1e-5)


def test_compatible_and_incompatible_tiny_pairs(tiny_dir, tiny_verifier, tiny_draft):
    verifier = LlamaModel(tiny_verifier, n_ctx=32).vocab_info()
    ensure_compatible(verifier, LlamaModel(tiny_draft, n_ctx=32).vocab_info())
    cases = {
        "tokenizer type": write_tiny_llama(tiny_dir / "bpe.gguf", vocab_type="bpe"),
        "vocabulary size": write_tiny_llama(tiny_dir / "big.gguf", n_vocab=1521 + 200),
        "token texts": write_tiny_llama(tiny_dir / "renamed.gguf", token_text_override={300: "zzz"}),
        "special tokens": write_tiny_llama(tiny_dir / "eos.gguf", eos_id=0),
    }
    for item, path in cases.items():
        other = LlamaModel(path, n_ctx=32).vocab_info()
        with pytest.raises(IncompatibleModelsError, match=item):
            ensure_compatible(verifier, other)
    findings = compare_vocabularies(verifier, LlamaModel(cases["token texts"], n_ctx=32).vocab_info())
    assert "token 300" in [f for f in findings if f.item == "token texts"][0].detail


def test_smollm2_cannot_draft_for_qwen(smollm2, qwen_pair):
    qwen = LlamaModel(qwen_pair[0], n_ctx=32).vocab_info()
    with pytest.raises(IncompatibleModelsError, match="vocabulary size|special tokens|token texts"):
        ensure_compatible(qwen, LlamaModel(smollm2, n_ctx=32).vocab_info())


def test_bad_files_are_refused_with_a_reason(tmp_path, tiny_verifier):
    with pytest.raises(ModelLoadError, match="no such file"):
        LlamaModel(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        LlamaModel(tmp_path / "text.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_verifier.read_bytes()[: tiny_verifier.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaModel(truncated)


def _chain_row(model, tokens):
    """What a model scores after `tokens`, evaluated as a plain chain from scratch."""
    return model.eval(tokens, n_logits=1)[0]


@pytest.mark.parametrize("model_file", ["tiny_verifier", "smollm2"])
def test_a_tree_scores_every_path_as_a_chain_would_and_keeps_the_chosen_one(model_file, request):
    path_file = request.getfixturevalue(model_file)
    context = [1, 20, 30, 40]
    # pending 40 -> {50 -> 52, 51 -> {53, 54 -> 55}}: four paths, three leaves
    tokens, parents = [40, 50, 51, 52, 53, 54, 55], [-1, 0, 0, 1, 2, 2, 5]
    model = LlamaModel(path_file, n_ctx=64, n_threads=1)
    model.eval(context[:-1], n_logits=0)
    rows = model.eval_tree(tokens, parents, n_logits=len(tokens))
    fresh = LlamaModel(path_file, n_ctx=64, n_threads=1)
    for node in range(len(tokens)):
        path, walk = [], node
        while walk >= 0:
            path.insert(0, tokens[walk])
            walk = parents[walk]
        fresh.rewind(0)
        expected = _chain_row(fresh, context[:-1] + path)
        np.testing.assert_allclose(rows[node], expected, atol=2e-3 * np.abs(expected).max())
        assert np.argmax(rows[node]) == np.argmax(expected)
    # Keep 40 -> 51 -> 54 -> 55: the cache then holds what of that path it can keep exactly (here
    # 40: llama/tree.py), and with the rest fed again the next token scores as after a chain.
    model.keep_path([0, 2, 5, 6])
    kept = context[:-1] + [40, 51, 54, 55]
    assert model.cached == kept[: model.n_past]
    fresh.rewind(0)
    expected = _chain_row(fresh, kept + [60])
    got = model.eval(kept[model.n_past :] + [60], n_logits=1)[0]
    np.testing.assert_allclose(got, expected, atol=2e-3 * np.abs(expected).max())
    # A second tree after a first, then a rewind into the context: the branches are gone too.
    model.eval_tree([60, 61, 62], [-1, 0, 0], n_logits=3)
    model.keep_path([0, 1])
    assert model.cached[-2:] == [60, 61]
    model.rewind(2)
    fresh.rewind(0)
    expected = _chain_row(fresh, context[:2] + [70])
    np.testing.assert_allclose(model.eval([70], n_logits=1)[0], expected, atol=2e-3 * np.abs(expected).max())


def test_keep_path_refuses_a_path_that_is_not_one(tiny_verifier):
    model = LlamaModel(tiny_verifier, n_ctx=64, n_threads=1)
    model.eval([1, 20], n_logits=0)
    model.eval_tree([30, 31, 32], [-1, 0, 0], n_logits=3)
    with pytest.raises(ValueError, match="not a path"):
        model.keep_path([0, 1, 2])


def test_the_file_type_is_named_as_quantize_names_it(gemma270m, tiny_verifier):
    # llama.cpp's description says "Q4_K - Medium"; Ollama's /api/show and llama.cpp's quantize say "Q4_K_M".
    gemma = LlamaModel(gemma270m, n_ctx=64).info()
    assert gemma.file_type == "Q4_K_M" and "Medium" in gemma.description
    assert LlamaModel(tiny_verifier, n_ctx=64).info().file_type == "F32"
