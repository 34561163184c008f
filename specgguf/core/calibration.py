"""Calibration runs: the engine, greedy at a fixed K, over a few prompts (token ids), the verifier
left empty after. What drafts/made.py measures a draft by (`acceptance`; a draft of another
vocabulary through its `CrossVocab`), what n-gram drafts alone give here (`ngram_rate`, the bar a
found draft of another vocabulary must clear), what a draft right at some rate should give
(`expected_rate`) and ranks a hot vocabulary with (`written_counts`: the
tokens the verifier itself writes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .costs import MachineCosts, StepCosts
from .cross_drafter import CrossVocab
from .drafters import DrafterKind, DraftSettings, build_drafter
from .engine import FixedK, StepEvent, speculate
from .kpolicy import PolicyConfig
from .model import Model
from .rounds import expected_at
from .sampling import SamplingSettings


def _greedy(
    verifier: Model,
    kind: DrafterKind,
    draft: Model | None,
    prompts: Sequence[list[int]],
    *,
    k: int,
    max_tokens: int,
    cross: CrossVocab | None = None,
) -> Iterator[StepEvent]:
    for tokens in prompts:
        yield from speculate(
            verifier=verifier,
            drafter=build_drafter(kind, draft, DraftSettings(cross=cross)),
            prompt_tokens=tokens,
            k=FixedK(k),
            max_tokens=max_tokens,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )


def acceptance(
    verifier: Model,
    draft: Model,
    prompts: Sequence[list[int]],
    *,
    k: int,
    max_tokens: int,
    cross: CrossVocab | None = None,
) -> float:
    """Per-position acceptance of `draft`'s drafts (through text where `cross` is given): the chance a
    position is accepted given the ones before it were (a position is tested only then: the first
    rejection ends the step)."""
    accepted = tested = 0
    for event in _greedy(verifier, "model", draft, prompts, k=k, max_tokens=max_tokens, cross=cross):
        accepted += event.n_accepted
        tested += min(event.n_accepted + 1, event.n_drafted)
    verifier.rewind(0)
    return accepted / tested if tested else 0.0


def written_counts(verifier: Model, prompts: Sequence[list[int]], *, k: int, max_tokens: int) -> np.ndarray:
    """How often the verifier writes each token answering `prompts` (drafted by n-grams alone: the
    same tokens, sooner)."""
    counts = np.zeros(verifier.n_vocab, dtype=np.int64)
    for event in _greedy(verifier, "ngram", None, prompts, k=k, max_tokens=max_tokens):
        np.add.at(counts, np.asarray(event.tokens, dtype=np.int64), 1)
    verifier.rewind(0)
    return counts


def ngram_rate(
    verifier: Model, prompts: Sequence[list[int]], verify: tuple[float, ...], *, k: int, max_tokens: int
) -> float:
    """Tokens per second n-gram drafts alone (prompt lookup, this run's own n-grams) should give
    here: their greedy steps at K, each charged what its batch costs to verify (`verify`, by batch
    size: the same table a draft's expected rate is priced on; an n-gram draft costs nothing to make)."""
    costs = StepCosts(MachineCosts(verify, 0.0).rising(), trust=PolicyConfig().cost_trust)  # as expected_rate
    tokens, drafted = 0, []
    for event in _greedy(verifier, "ngram", None, prompts, k=k, max_tokens=max_tokens):
        tokens += len(event.tokens)
        drafted.append(event.n_drafted)
    verifier.rewind(0)
    seconds = float(costs.step(np.asarray(drafted, dtype=np.int64), "ngram").sum()) if drafted else 0.0
    return tokens / seconds if seconds > 0 else 0.0


def expected_rate(costs: MachineCosts, acceptance: float, config: PolicyConfig | None = None) -> float:
    """Tokens per second a draft should give at its best fixed K ≥ 1, when each draft position is
    accepted with probability `acceptance` given the ones before it were: max over k of E(k) / T(k),
    E(k) = 1 + a + … + a^k, T(k) = k·t_draft + t_verify(k + 1). (It may be below plain decoding's
    1 / t_verify(1): then this draft cannot win here, and a faster one comes closer. The verify table
    is taken as never falling, MachineCosts.rising.)"""
    config = config or PolicyConfig()
    ks = np.arange(1, config.k_max + 1)
    expected = expected_at(acceptance, config.k_max)[1:]
    seconds = StepCosts(costs.rising(), trust=config.cost_trust).step(ks)
    return float((expected / seconds).max())
