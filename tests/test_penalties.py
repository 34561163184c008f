"""Logit bias and llama.cpp's penalties (frequency, presence, repeat): the formula, and speculation
staying exact for the penalised distribution through the whole loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from fakes import FakeModel
from specgguf.core.drafters import HybridDrafter
from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import Penalties, SamplingSettings, apply_penalties

PENALTIES = Penalties(frequency=0.4, presence=0.3, repeat=1.3, last_n=6, bias=((1, 0.7),))


def test_the_penalties_follow_llama_cpps_formula():
    settings = SamplingSettings(penalties=Penalties(frequency=0.5, presence=0.25, repeat=2.0, last_n=4))
    logits = np.array([1.0, -1.0, 3.0, 0.5])
    # In the window [9, 0, 1, 1] (the 0 before it falls outside): token 0 once, token 1 twice.
    out = apply_penalties(logits, [0, 0, 9, 0, 1, 1], settings)
    assert out.tolist() == [1.0 / 2 - 0.5 - 0.25, -1.0 * 2 - 2 * 0.5 - 0.25, 3.0, 0.5]
    assert logits.tolist() == [1.0, -1.0, 3.0, 0.5]  # the input row is left alone


def test_logit_bias_comes_first_and_nothing_set_changes_nothing():
    settings = SamplingSettings(penalties=Penalties(presence=1.0, bias=((2, -100.0), (0, 2.0))))
    assert apply_penalties(np.zeros(3), [0], settings).tolist() == [1.0, 0.0, -100.0]
    row = np.arange(3.0)
    assert apply_penalties(row, [0, 1, 2], SamplingSettings()) is row
    assert not Penalties(frequency=1.0, last_n=0).active


@pytest.mark.parametrize("bad", [{"repeat": 0.0}, {"last_n": -1}, {"frequency": float("nan")}])
def test_out_of_range_penalties_are_refused(bad):
    with pytest.raises(ValueError):
        Penalties(**bad)


def test_greedy_decoding_follows_the_penalised_argmax():
    # The verifier always prefers token 1; a presence penalty makes it alternate with token 2.
    verifier = FakeModel(lambda context: np.array([0.0, 2.0, 1.5]), n_vocab=3)
    draft = FakeModel(lambda context: np.array([0.0, 2.0, 1.5]), n_vocab=3)
    settings = SamplingSettings(temperature=0.0, penalties=Penalties(presence=1.0, last_n=1))
    events = speculate(
        verifier=verifier,
        drafter=ModelDrafter(draft),
        prompt_tokens=[0],
        k=3,
        max_tokens=6,
        settings=settings,
        rng=np.random.default_rng(0),
    )
    events = list(events)
    assert [token for event in events for token in event.tokens] == [1, 2, 1, 2, 1, 2]
    assert sum(event.n_accepted for event in events) > 0  # the draft, penalised the same way, agreed


# --- The loop's output law with penalties: penalised plain decoding -----------------------

VOCAB = 3
LENGTH = 4  # the first token is the prompt pass's (a plain step): three positions speculated
PROMPT = [0, 1, 2, 0, 1]


def _table(seed):
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(VOCAB), size=VOCAB))


def _penalised_by_hand(logits, context):
    """The reference, written out apart from `apply_penalties`."""
    out = logits.copy()
    out[1] += 0.7
    window = context[-PENALTIES.last_n :]
    for token in set(window):
        count = window.count(token)
        out[token] = out[token] * 1.3 if out[token] <= 0 else out[token] / 1.3
        out[token] -= count * 0.4 + 0.3
    return out


def _expected(target_table):
    expected = np.zeros((VOCAB,) * LENGTH)
    for sequence in itertools.product(range(VOCAB), repeat=LENGTH):
        context, probability = list(PROMPT), 1.0
        for token in sequence:
            logits = _penalised_by_hand(target_table[context[-1]], context)
            probability *= np.exp(logits[token]) / np.exp(logits).sum()
            context.append(token)
        expected[sequence] = probability
    return expected


def _p_value(kind, seed, n_sequences=12_000):
    target_table, draft_table = _table(1), _table(2)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, penalties=PENALTIES)
    verifier = FakeModel(lambda context: target_table[context[-1]], n_vocab=VOCAB)
    draft = FakeModel(lambda context: draft_table[context[-1]], n_vocab=VOCAB)
    drafter = (
        ModelDrafter(draft)
        if kind == "model"
        else HybridDrafter(ModelDrafter(draft), NgramDrafter(min_ngram=1), min_match=2)
    )
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * LENGTH)
    n_accepted = 0
    for _ in range(n_sequences):
        events = list(
            speculate(
                verifier=verifier,
                drafter=drafter,
                prompt_tokens=PROMPT,
                k=FixedK(3),
                max_tokens=LENGTH,
                settings=settings,
                rng=rng,
            )
        )
        counts[tuple(token for event in events for token in event.tokens)] += 1
        n_accepted += sum(event.n_accepted for event in events)
    assert n_accepted > n_sequences // 2  # drafts were really taken, not only the verifier's tokens
    return chisquare(counts.ravel(), _expected(target_table).ravel() * n_sequences).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "hybrid"])
def test_speculative_output_with_penalties_follows_penalised_plain_decoding(kind):
    assert _p_value(kind, seed=3) > 1e-4


@pytest.mark.slow
def test_verifier_rows_penalised_with_the_steps_context_fail_the_same_check(monkeypatch):
    """The planted wrong variant: every verifier row penalised for the step's starting context,
    not for the drafts along its own path (the draft penalised correctly)."""
    import specgguf.core.engine

    monkeypatch.setattr(specgguf.core.engine, "_path_context", lambda context, drafts, parents, node: context)
    assert _p_value("model", seed=3) < 1e-12


@pytest.mark.slow
def test_penalties_on_the_draft_alone_fail_the_same_check(monkeypatch):
    """The other planted variant: the verifier's rows left unpenalised."""
    import specgguf.core.engine

    monkeypatch.setattr(specgguf.core.engine, "apply_penalties", lambda logits, context, settings: logits)
    assert _p_value("model", seed=3) < 1e-12
