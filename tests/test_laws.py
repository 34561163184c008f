"""The loop's output law under the whole sampler chain: temperatures 0.5 and 1.5 with top-k, top-p and
min-p all cutting, through `core.engine.speculate` with scripted fakes, for the model drafter, the
hybrid and draft trees (test_grammar_laws.py: under grammars, with this harness). The law is the
joint of the first few tokens of plain decoding with the verifier's processed distributions.

At temperature 1 with no filters the processed distribution is the plain softmax, so a drafter that
reports its q processed the wrong way cannot be told from a right one there; these tests can. Each
planted wrong rule (q reported without temperature or without top-k, u < (p - q) / p) must fail the
same check the real loop passes: p > 1e-4 for the loop, p < 1e-12 for a plant, with fixed seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from scipy.stats import chisquare

import specgguf.core.engine
from fakes import FakeModel
from specgguf.core.constraint import Constraint
from specgguf.core.drafters import HybridDrafter
from specgguf.core.drafting import Drafter
from specgguf.core.engine import FixedK, KPolicy, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import SamplingSettings, mask_logits, process_logits
from test_engine import Siblings
from test_sampling import _wrong_accept

VOCAB = 6
PROMPT = [0, 1, 2, 0, 1]  # repeats, so prompt lookup has something to propose


def _table(seed, flatness=1.0):
    """log next-token probabilities given the previous token (rows flatter as `flatness` grows)."""
    return np.log(np.random.default_rng(seed).dirichlet(np.full(VOCAB, flatness), size=VOCAB))


# The draft's rows are flatter: top-k cuts there what top-p and min-p would leave, so a q reported
# without top-k is far off (test_every_knob_changes_the_law checks the choice).
TARGET, DRAFT = _table(26), _table(13, flatness=4.0)
TEMPERATURES = [0.5, 1.5]


def _settings(temperature):
    return SamplingSettings(temperature=temperature, top_k=4, top_p=0.9, min_p=0.15)


# Each knob's effect undone, one at a time: what a wrong processing would report.
KNOBS_OFF = {
    "temperature": {"temperature": 1.0},
    "top-k": {"top_k": 0},
    "top-p": {"top_p": 1.0},
    "min-p": {"min_p": 0.0},
}


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize(
    "table, knob",
    [
        *(pytest.param(TARGET, knob, id=f"verifier-{knob}") for knob in KNOBS_OFF),
        *(pytest.param(DRAFT, knob, id=f"draft-{knob}") for knob in ("temperature", "top-k")),
    ],
)
def test_every_knob_changes_the_law(table, knob, temperature):
    """The tests below are only as sharp as their settings: every knob changes the verifier's
    processed distributions (the law is not the plain softmax), and the knobs the planted drafters
    leave out change the draft's (a q processed without them is wrong)."""
    settings = _settings(temperature)
    wrong = replace(settings, **KNOBS_OFF[knob])
    assert np.abs(process_logits(table, settings) - process_logits(table, wrong)).sum(axis=1).max() > 0.02


# --- the law and the check ----------------------------------------------------------------


def _law(settings, length, grammar: Constraint | None = None):
    """The exact joint law of the first `length` tokens of plain decoding with the verifier: each
    token from its processed distribution (masked by the grammar's state first, if any)."""
    law = np.zeros((VOCAB,) * length)

    def walk(prefix, probability):
        if len(prefix) == length:
            law[tuple(prefix)] = probability
            return
        logits = TARGET[(PROMPT + prefix)[-1]]
        if grammar is not None:
            logits = mask_logits(logits, grammar.allowed())
        probs = process_logits(logits, settings)[0]
        for token in np.flatnonzero(probs):
            if grammar is not None:
                grammar.advance(int(token))
            walk([*prefix, int(token)], probability * probs[token])
            if grammar is not None:
                grammar.rollback(1)

    walk([], 1.0)
    return law


def _p_value(counts, law):
    """Chi-square p-value of sequence counts against their law (cells expected under 5 pooled)."""
    support = law > 0
    assert counts[~support].sum() == 0, "emitted a sequence the verifier's processed law never does"
    observed, expected = counts[support], law[support] * counts.sum()
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return chisquare(observed, expected).pvalue


@dataclass
class Tally:
    counts: np.ndarray
    sources: set[str | None] = field(default_factory=set)
    forced_refused: bool = False  # a grammar's forced draft was refused by the verifier at least once


def _tally(
    drafter: Drafter,
    policy: KPolicy,
    settings: SamplingSettings,
    *,
    length: int,
    seed: int,
    n_sequences: int,
    grammar: Callable[[], Constraint] | None = None,
) -> Tally:
    """Sequences of `length` tokens through the engine; `grammar` makes a fresh constraint per answer."""
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    rng = np.random.default_rng(seed)
    tally = Tally(np.zeros((VOCAB,) * length))
    for _ in range(n_sequences):
        events = list(
            speculate(
                verifier=verifier,
                drafter=drafter,
                prompt_tokens=PROMPT,
                k=policy,
                max_tokens=length,
                settings=settings,
                rng=rng,
                constraint=grammar() if grammar is not None else None,
            )
        )
        tally.counts[tuple(token for event in events for token in event.tokens)] += 1
        tally.sources.update(event.draft_source for event in events if event.n_drafted)
        tally.forced_refused |= any(e.draft_source == "grammar" and e.n_accepted < e.n_drafted for e in events)
    return tally


def _draft_model():
    return FakeModel(lambda context: DRAFT[context[-1]], n_vocab=VOCAB)


class _CountedGuess:
    """Prompt lookup's guesses for the draft model to read ahead, counting those it gave."""

    def __init__(self, ngram: NgramDrafter):
        self.ngram, self.given = ngram, 0

    def __call__(self, context: list[int], k: int) -> tuple[list[int], list[float]]:
        tokens, chances = self.ngram.guess(context, k)
        self.given += bool(tokens)
        return tokens, chances


def _path(kind) -> tuple[Drafter, KPolicy]:
    """The drafter and K policy of one path: the draft model's chain, the hybrid (its draft model reading
    prompt lookup's guesses ahead, as `specgguf` builds it, or not), or draft trees."""
    if kind == "hybrid":
        return HybridDrafter(ModelDrafter(_draft_model()), NgramDrafter(min_ngram=1), min_match=2), FixedK(3)
    if kind == "read-ahead":
        ngram = NgramDrafter(min_ngram=1)
        guess = _CountedGuess(ngram)
        return HybridDrafter(ModelDrafter(_draft_model(), guess=guess), ngram, min_match=2), FixedK(3)
    return ModelDrafter(_draft_model()), Siblings() if kind == "tree" else FixedK(3)


LENGTH = 4  # the first token is the prompt pass's (a plain step): three positions speculated
PATHS = ["model", "hybrid", "read-ahead", "tree"]
SOURCES = {"model": {"model"}, "hybrid": {"model", "ngram"}, "read-ahead": {"model", "ngram"}, "tree": {"model"}}


def _path_p_value(kind, settings, *, seed, n_sequences=20_000):
    drafter, policy = _path(kind)
    tally = _tally(drafter, policy, settings, length=LENGTH, seed=seed, n_sequences=n_sequences)
    assert tally.sources == SOURCES[kind]
    if isinstance(policy, Siblings):
        assert policy.taken == {True, False}  # siblings were drafted, and both taken and refused
    guess = getattr(getattr(drafter, "model_drafter", None), "guess", None)
    if isinstance(guess, _CountedGuess):
        assert guess.given > n_sequences // 10  # the draft model read guesses ahead
    return _p_value(tally.counts, _law(settings, LENGTH))


@pytest.mark.slow
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("kind", PATHS)
def test_sampled_sequences_follow_the_verifiers_processed_law(kind, temperature):
    assert _path_p_value(kind, _settings(temperature), seed=31) > 1e-4


# --- planted wrong rules: each must fail the check above ------------------------------------


def _misreporting(knob) -> Callable:
    """`ModelDrafter.propose`, but each draft's reported q is the draft model's row processed with
    `knob` undone (the token itself still drawn from the right q): the bug of a drafter that samples
    through one chain and reports another."""
    propose = ModelDrafter.propose

    def misreported(self, context, k, step):
        drafts = propose(self, context, k, step)
        wrong = replace(step.settings, **KNOBS_OFF[knob])
        parents = drafts.tree()
        for node, parent in enumerate(parents[: len(drafts.probs)]):
            logits = self.model.next_logits(context + _ancestors(drafts.tokens, parents, parent))
            if drafts.masks:  # under a grammar (a chain): mask i came before draft i
                mask = drafts.masks[node]
                if mask is None:  # a forced token inside the chain: the grammar's, not the model's
                    continue
                logits = mask_logits(logits, mask)
            drafts.probs[node] = process_logits(logits, wrong)[0]
        return drafts

    return misreported


def _ancestors(tokens, parents, node):
    """The draft tokens on the path down to `node`, itself included (-1: none)."""
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


# At T = 0.5 a q left untempered is off by less than one left uncut (the cut tokens' mass is large in
# the draft's flat rows): more sequences for it, twice as many for the hybrid (the model drafts only
# part of the time).
PLANT_SEQUENCES = {"temperature": 12_000, "top-k": 4000}


@pytest.mark.parametrize("knob", [pytest.param("temperature", marks=pytest.mark.slow), "top-k"])
@pytest.mark.parametrize("kind", PATHS)
def test_a_draft_reporting_q_processed_wrongly_fails_the_check(monkeypatch, kind, knob):
    monkeypatch.setattr(ModelDrafter, "propose", _misreporting(knob))
    n_sequences = PLANT_SEQUENCES[knob] * (2 if kind in ("hybrid", "read-ahead") else 1)
    assert _path_p_value(kind, _settings(0.5), seed=32, n_sequences=n_sequences) < 1e-12


def _wrong_chain_rule(*, target_probs, draft_probs, draft_tokens, parents, rng):
    """test_sampling's u < (p - q) / p on a chain, in `accept_tree`'s shape."""
    assert list(parents) == list(range(-1, len(draft_tokens) - 1)), "a chain"
    targets = np.array([target_probs(node) for node in range(-1, len(draft_tokens))])
    n_accepted, next_token = _wrong_accept(
        target_probs=targets,
        draft_probs=np.reshape(draft_probs, (len(draft_tokens), VOCAB)),
        draft_tokens=np.array(draft_tokens, dtype=np.int64),
        rng=rng,
    )
    return list(range(n_accepted)), next_token


@pytest.mark.parametrize("kind", ["model", "hybrid", "read-ahead"])
def test_the_wrong_acceptance_rule_fails_the_check(monkeypatch, kind):
    monkeypatch.setattr(specgguf.core.engine, "accept_tree", _wrong_chain_rule)
    assert _path_p_value(kind, _settings(0.5), seed=33, n_sequences=4000) < 1e-12
