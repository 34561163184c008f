"""Speculation under a grammar (core/constraint.py, core/forced_drafter.py): the output follows masked
plain decoding's law, forced tokens are free drafts, the grammar's state moves only by accepted tokens."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

import specgguf.core.engine
import specgguf.core.grammar_walk
from fakes import FakeModel, TableConstraint
from specgguf.core.costs import MachineCosts
from specgguf.core.drafters import HybridDrafter
from specgguf.core.engine import FixedK, speculate
from specgguf.core.hot_vocab import HotVocab
from specgguf.core.kpolicy import PolicyConfig, adaptive_policy
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import SamplingSettings

VOCAB = 4
LENGTH = 4
PROMPT = [0, 1, 2, 0, 1]  # repeats, so prompt lookup proposes (sometimes what the grammar forbids)
# State 0 allows 0, 1, 2; after 0 the grammar forces 3; after 1 it allows 1 or 2; then back to 0.
ALLOWED = {0: {0, 1, 2}, 1: {3}, 2: {1, 2}}
SAMPLING = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def _step(state, token):
    return {0: 1, 1: 2}.get(token, 0) if state == 0 else 0


def _grammar():
    return TableConstraint(ALLOWED, _step, n_vocab=VOCAB)


def _table(seed):
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(VOCAB), size=VOCAB))


TARGET, DRAFT = _table(11), _table(25)  # the draft under-proposes 0 somewhere: a residual 0 starts a forced step


# Drafts that cannot score token 3, which the grammar forces after a 0: one whose vocabulary is a
# token short, and a hot-vocabulary draft over tokens 0, 1, 2 (3 read as 0). Their rows there have
# no finite entry under the mask, so their drafts end there.
HOT_IDS, HOT_FEED = np.array([0, 1, 2]), np.array([0, 1, 2, 0])


def _short_draft(next_logits):
    small = FakeModel(lambda context: next_logits(context)[: VOCAB - 1], n_vocab=VOCAB - 1)
    return small, HotVocab(FakeModel(lambda context: next_logits(context)[HOT_IDS], n_vocab=3), HOT_IDS, HOT_FEED)


def _drafter(kind):
    draft = FakeModel(lambda context: DRAFT[context[-1]], n_vocab=VOCAB)
    if kind == "model":
        return ModelDrafter(draft)
    if kind in ("smaller", "hot"):
        smaller, hot = _short_draft(lambda context: DRAFT[context[-1]])
        return ModelDrafter(smaller if kind == "smaller" else hot)
    if kind == "ngram":
        return NgramDrafter(min_ngram=1)
    return HybridDrafter(ModelDrafter(draft), NgramDrafter(min_ngram=1), min_match=2)


def _masked_law():
    """The exact law of LENGTH tokens of masked plain decoding: each token from the verifier's
    distribution masked by the grammar's state and renormalised."""
    law = np.zeros((VOCAB,) * LENGTH)
    target = np.exp(TARGET)
    for sequence in itertools.product(range(VOCAB), repeat=LENGTH):
        probability, state, previous = 1.0, 0, PROMPT[-1]
        for token in sequence:
            allowed = sorted(ALLOWED[state])
            if token not in allowed:
                probability = 0.0
                break
            probability *= target[previous, token] / target[previous, allowed].sum()
            state, previous = _step(state, token), token
        law[sequence] = probability
    return law


def _p_value(kind, policy, seed, n_sequences=20_000):
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    drafter = _drafter(kind)
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * LENGTH)
    sources = set()
    for _ in range(n_sequences):
        grammar = _grammar()
        events = list(
            speculate(
                verifier=verifier,
                drafter=drafter,
                prompt_tokens=PROMPT,
                k=policy,
                max_tokens=LENGTH,
                settings=SAMPLING,
                rng=rng,
                constraint=grammar,
            )
        )
        output = [t for event in events for t in event.tokens]
        counts[tuple(output)] += 1
        sources.update(event.draft_source for event in events if event.n_drafted)
        assert len(grammar.states) == LENGTH + 1  # advanced by the output only, rolled back elsewhere
    law = _masked_law()
    support = law > 0
    assert counts[~support].sum() == 0, "the output broke the grammar"
    return chisquare(counts[support], law[support] * n_sequences).pvalue, sources


# The forced 3 after a 0 is a free draft where a step starts there (the model's chain drafts it
# itself, masked, when the 0 was its own draft).
EXPECTED_SOURCES = {
    "model": {"model", "grammar"},
    "ngram": {"ngram", "grammar"},
    "hybrid": {"model", "ngram", "grammar"},
    "smaller": {"model", "grammar"},
    "hot": {"model", "grammar"},
    "plain": set(),
}
CHEAP_DRAFTS = MachineCosts((0.03, 0.04, 0.05, 0.06), draft=0.001)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, policy",
    [
        ("model", FixedK(3)),
        ("ngram", FixedK(3)),
        ("hybrid", FixedK(3)),
        ("hybrid", adaptive_policy("hybrid", CHEAP_DRAFTS, PolicyConfig(k_max=3, k_min=1))),
        ("model", FixedK(0)),
        ("smaller", FixedK(3)),
        ("hot", FixedK(3)),
    ],
    ids=["model", "ngram", "hybrid", "hybrid-adaptive", "plain", "smaller-vocab", "hot-vocab"],
)
def test_sampled_answers_under_a_grammar_follow_masked_plain_decodings_law(kind, policy):
    p_value, sources = _p_value(kind, policy, seed=21)
    assert p_value > 1e-4
    assert sources == EXPECTED_SOURCES[kind if policy.choose("model") else "plain"]


def _stale_mask(self, node):
    """Planted wrong rule: every row masked by the state at the step's start (not advanced along
    the drafted prefix)."""
    if -1 not in self._masks:
        self._masks[-1] = self.constraint.allowed()
    return self._masks[-1]


@pytest.mark.slow
def test_a_mask_not_advanced_along_the_draft_fails_the_check(monkeypatch):
    monkeypatch.setattr(specgguf.core.grammar_walk.GrammarWalk, "mask", _stale_mask)
    monkeypatch.setattr(specgguf.core.grammar_walk.GrammarWalk, "commit", _commit_all)
    with pytest.raises(AssertionError, match="broke the grammar|not allowed"):
        _p_value("model", FixedK(3), seed=22, n_sequences=4000)


def _commit_all(self, emitted):
    for token in emitted:
        self.constraint.advance(token)


@pytest.mark.slow
def test_masking_only_the_drafts_fails_the_check(monkeypatch):
    """Planted wrong rule: the draft masked and cut by the grammar, the verifier's rows not."""
    monkeypatch.setattr(specgguf.core.engine, "mask_logits", lambda logits, allowed: logits)
    with pytest.raises(AssertionError, match="broke the grammar|not allowed"):
        _p_value("model", FixedK(3), seed=23, n_sequences=4000)


# Greedy: after 1 comes 2, after 2 comes 0 (then the forced 3, which it likes least), after 3 comes 1.
GREEDY_TARGET = np.log(
    np.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.5, 0.1], [0.6, 0.2, 0.1, 0.1], [0.2, 0.5, 0.2, 0.1]])
)


def test_greedy_under_a_grammar_is_masked_greedy_and_forced_tokens_are_free_drafts():
    verifier = FakeModel(lambda context: GREEDY_TARGET[context[-1]], n_vocab=VOCAB)
    grammar = _grammar()
    events = list(
        speculate(
            verifier=verifier,
            drafter=_drafter("model"),
            prompt_tokens=PROMPT,
            k=FixedK(4),
            max_tokens=12,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
            constraint=grammar,
        )
    )
    output = [t for event in events for t in event.tokens]
    expected, state, previous = [], 0, 1
    for _ in range(12):
        allowed = sorted(ALLOWED[state])
        token = allowed[int(np.argmax(GREEDY_TARGET[previous, allowed]))]
        expected.append(token)
        state, previous = _step(state, token), token
    assert output == expected
    assert grammar.states[1:] == _states(expected)
    forced = [event for event in events if event.draft_source == "grammar"]
    assert forced and all(event.n_accepted == event.n_drafted for event in forced)


def _states(tokens):
    state, states = 0, []
    for token in tokens:
        state = _step(state, token)
        states.append(state)
    return states


def test_a_prompt_lookup_draft_is_cut_at_its_first_forbidden_token():
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    # The grammar forbids 2 at the start: the lookup's proposal after [.., 0, 1] is [2, 0, 1, ...].
    grammar = TableConstraint({0: {0, 1, 3}, 1: {0, 1, 3}}, lambda state, token: 1, n_vocab=VOCAB)
    events = list(
        speculate(
            verifier=verifier,
            drafter=NgramDrafter(min_ngram=1),
            prompt_tokens=PROMPT,
            k=FixedK(3),
            max_tokens=1,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
            constraint=grammar,
        )
    )
    assert events[0].n_drafted == 0 and events[0].tokens[0] != 2


def _masked_greedy(target, n):
    expected, state, previous = [], 0, PROMPT[-1]
    for _ in range(n):
        allowed = sorted(ALLOWED[state])
        token = allowed[int(np.argmax(target[previous, allowed]))]
        expected.append(token)
        state, previous = _step(state, token), token
    return expected


class Unforced(TableConstraint):
    """The same grammar, saying nothing of what it forces (as llguidance, at a token boundary it cannot
    settle yet): a draft must score the mask's one token itself."""

    def forced(self) -> list[int]:
        return []


@pytest.mark.parametrize("forcing", [True, False])
@pytest.mark.parametrize("kind", ["smaller", "hot"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_that_cannot_score_what_the_grammar_allows_ends_its_draft_there(kind, temperature, forcing):
    """The draft likes 0 best; after a 0 the grammar allows only 3, which it has no logit for: its
    chain stops there (it drafted token 0 at T = 0, failed on an empty pool at T > 0), unless the
    grammar says it forces the 3, which is then the grammar's draft, and the chain goes on after it."""
    verifier = FakeModel(lambda context: GREEDY_TARGET[context[-1]], n_vocab=VOCAB)
    settings = SamplingSettings(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
    rng = np.random.default_rng(5)
    support, chains = _masked_law() > 0, []
    for _ in range(1 if temperature == 0.0 else 200):
        draft = _short_draft(lambda context: np.log([0.7, 0.1, 0.1, 0.1]))[kind == "hot"]
        grammar = _grammar() if forcing else Unforced(ALLOWED, _step, n_vocab=VOCAB)
        events = list(
            speculate(
                verifier=verifier,
                drafter=ModelDrafter(draft),
                prompt_tokens=PROMPT,
                k=FixedK(3),
                max_tokens=LENGTH + 1 if temperature else 12,  # (the first token is the prompt pass's)
                settings=settings,
                rng=rng,
                constraint=grammar,
            )
        )
        output = [t for event in events for t in event.tokens]
        chains += [event.accepted + event.rejected for event in events if event.draft_source == "model"]
        assert grammar.states[1:] == _states(output)
        if temperature == 0.0:
            assert output == _masked_greedy(GREEDY_TARGET, 12)  # the verifier's masked argmax per step
        else:
            assert support[tuple(output[:LENGTH])]
    assert any(0 in chain for chain in chains)  # it drafted a 0 ...
    if forcing:  # ... then the grammar's 3, and drafted on
        assert any(chain[i : i + 3] == [0, 3, 0] for chain in chains for i in range(len(chain)))
    else:  # ... and nothing after it
        assert all(0 not in chain[:-1] for chain in chains)
