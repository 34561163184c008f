"""The loop's output law under a grammar with the draft model (not prompt lookup), at temperatures 0.5
and 1.5 with top-k, top-p and min-p (test_laws.py's harness): a grammar whose forced tokens are not
its mask's only choice (as llguidance's forced text can be tokenized more than one way), alone and
as the call grammar of a lazy tool-call grammar (core/lazy_grammar.py). The law is masked plain
decoding's: each token from the verifier's row masked by the grammar's state, then processed."""

from __future__ import annotations

import numpy as np
import pytest

import specgguf.core.forced_drafter
from fakes import TableConstraint
from specgguf.core.drafting import fixed_drafts
from specgguf.core.engine import FixedK
from specgguf.core.lazy_grammar import LazyGrammar
from specgguf.core.model_drafter import ModelDrafter
from test_laws import (
    PLANT_SEQUENCES,
    TEMPERATURES,
    VOCAB,
    _draft_model,
    _law,
    _misreporting,
    _p_value,
    _settings,
    _tally,
)

LENGTH = 4


class CanonicalForced(TableConstraint):
    """A grammar whose forced text has more than one tokenization: `forced` gives the canonical
    tokens (`canonical`: state -> token), the mask allows the others too."""

    def __init__(self, allowed, step, canonical: dict[int, int], *, n_vocab):
        super().__init__(allowed, step, n_vocab=n_vocab)
        self.canonical = canonical

    def forced(self) -> list[int]:
        state, tokens = self.state, list[int]()
        while state in self.canonical and len(tokens) < 8:
            tokens.append(self.canonical[state])
            state = self.step(state, tokens[-1])
        return tokens


# State 0: any token; a 0 starts the forced text "ab", canonically the one token 1, but "a" (3) then
# "b" (4) is allowed too (the verifier likes both); after the 3, the 4 is the mask's only choice.
FORCED_ALLOWED = {0: set(range(VOCAB)), 1: {1, 3}, 2: {4}}


def _forced_step(state, token):
    return {(0, 0): 1, (1, 3): 2}.get((state, token), 0)


def _forced():
    return CanonicalForced(FORCED_ALLOWED, _forced_step, {1: 1, 2: 4}, n_vocab=VOCAB)


class Call(CanonicalForced):
    """A tool call's arguments: the forced text "ab" (1, or 3 then 4), then the call is complete."""

    def __init__(self):
        super().__init__({0: {1, 3}, 1: {4}, 2: set(range(VOCAB))}, self._next, {0: 1, 1: 4}, n_vocab=VOCAB)

    @staticmethod
    def _next(state, token):
        return 1 if (state, token) == (0, 3) else 2

    @property
    def accepting(self):
        return self.state == 2


def _tool_call():
    """Free text until the opener 0, then a call; after it the end 5, the whitespace 2 or another call."""
    end, between = np.zeros(VOCAB, dtype=bool), np.zeros(VOCAB, dtype=bool)
    end[5], between[2] = True, True
    return LazyGrammar(
        n_vocab=VOCAB, openers=[(0,)], calls=[Call], end=end, between=between, required=False, parallel=True
    )


GRAMMARS = {"forced": _forced, "tool-call": _tool_call}


def _grammar_tally(grammar, settings, *, seed, n_sequences=20_000):
    tally = _tally(
        ModelDrafter(_draft_model()),
        FixedK(3),
        settings,
        length=LENGTH,
        seed=seed,
        n_sequences=n_sequences,
        grammar=GRAMMARS[grammar],
    )
    assert tally.sources == {"model", "grammar"}
    return tally, _law(settings, LENGTH, GRAMMARS[grammar]())


@pytest.mark.slow
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_sampled_answers_under_a_grammar_follow_the_masked_processed_law(grammar, temperature):
    tally, law = _grammar_tally(grammar, _settings(temperature), seed=41)
    assert tally.forced_refused  # the verifier took the other tokenization where a step began forced
    assert _p_value(tally.counts, law) > 1e-4


def _unchecked(tokens, step, source):
    """Forced tokens taken without the verifier's check (the fast-forward that is exact only where the
    forced token is the mask's only choice): a q of 0 makes u * q(x) < p(x) wherever the mask allows x."""
    drafts = fixed_drafts(tokens, step, source)
    drafts.probs = [np.zeros_like(row) for row in drafts.probs]
    return drafts


@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_forced_tokens_taken_unchecked_fail_the_check(monkeypatch, grammar):
    monkeypatch.setattr(specgguf.core.forced_drafter, "fixed_drafts", _unchecked)
    tally, law = _grammar_tally(grammar, _settings(0.5), seed=42, n_sequences=4000)
    assert not tally.forced_refused
    assert _p_value(tally.counts, law) < 1e-12


@pytest.mark.slow
def test_a_draft_reporting_q_without_temperature_under_a_grammar_fails_the_check(monkeypatch):
    monkeypatch.setattr(ModelDrafter, "propose", _misreporting("temperature"))
    tally, law = _grammar_tally("forced", _settings(0.5), seed=43, n_sequences=PLANT_SEQUENCES["temperature"])
    assert _p_value(tally.counts, law) < 1e-12
