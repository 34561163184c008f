"""The loop's output law under a grammar with the draft model (not prompt lookup), at temperatures 0.5
and 1.5 with top-k, top-p and min-p (test_laws.py's harness): a grammar whose forced tokens are not
its mask's only choice (as llguidance's forced text can be tokenized more than one way), alone and
as the call grammar of a lazy tool-call grammar (core/lazy_grammar.py). Forced tokens are drafted
where a step begins (forced_drafter.py) and inside the draft model's chain, after a model draft that
leads to them (drafting.add_forced). The law is masked plain decoding's: each token from the
verifier's row masked by the grammar's state, then processed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import specgguf.core.forced_drafter
import specgguf.core.model_drafter
import test_laws
from fakes import TableConstraint
from specgguf.core.constraint import Constraint
from specgguf.core.drafting import add_forced, fixed_drafts
from specgguf.core.engine import FixedK
from specgguf.core.lazy_grammar import LazyGrammar
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
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

LENGTH = 5  # the first token is the prompt pass's (a plain step): four positions speculated


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


def _after_zero():
    """After a 0 the forced text "ef": canonically 4, or 3 then 5 (the verifier likes the 3 better)."""
    return CanonicalForced(
        {0: set(range(VOCAB)), 1: {4, 3}, 2: {5}},
        lambda state, token: {(0, 0): 1, (1, 3): 2}.get((state, token), 0),
        {1: 4, 2: 5},
        n_vocab=VOCAB,
    )


# A prompt whose lookup drafts 0, 1 after its last 2 and whatever first token follows it ("2, v" is
# followed by 0, 1 for every v): cut after the 0 (the grammar forbids the 1), where the grammar's forced
# 4 follows as the draft's tail. (The first token is the prompt pass's, drawn plain: lookups start after it.)
LOOKUP_PROMPT = [token for v in range(VOCAB) for token in (2, v, 0, 1)] + [2]
# A planted rule is checked on answers one token longer than the law tests': more of their steps draft.
PLANTED_LENGTH = LENGTH + 1


def _grammar_tally(
    grammar: Callable[[], Constraint], settings, *, seed, n_sequences=20_000, drafter="model", length=LENGTH
):
    tally = _tally(
        ModelDrafter(_draft_model()) if drafter == "model" else NgramDrafter(min_ngram=1),
        FixedK(3),
        settings,
        length=length,
        seed=seed,
        n_sequences=n_sequences,
        grammar=grammar,
    )
    assert drafter in tally.sources and tally.sources <= {drafter, "grammar"}
    return tally, _law(settings, length, grammar())


def _inner_forced(monkeypatch, add=add_forced, module=specgguf.core.model_drafter) -> list[int]:
    """The forced tokens taken in after drafts (`add` in place of `module`'s add_forced: the draft
    model's chains, or forced_drafter's tail after a prompt-lookup draft), as they come."""
    seen: list[int] = []

    def counted(drafts, step, *, room):
        forced = add(drafts, step, room=room)
        seen.extend(forced)
        return forced

    monkeypatch.setattr(module, "add_forced", counted)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_sampled_answers_under_a_grammar_follow_the_masked_processed_law(monkeypatch, grammar, temperature):
    inner = _inner_forced(monkeypatch)
    tally, law = _grammar_tally(GRAMMARS[grammar], _settings(temperature), seed=41)
    assert tally.forced_refused  # the verifier took the other tokenization where a step began forced
    assert inner  # and forced tokens were drafted inside the model's chains
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
    tally, law = _grammar_tally(GRAMMARS[grammar], _settings(0.5), seed=42, n_sequences=4000, length=PLANTED_LENGTH)
    assert not tally.forced_refused
    assert _p_value(tally.counts, law) < 1e-12


def _unchecked_inside(drafts, step, *, room):
    """Forced tokens inside a chain taken unchecked (q reported 0, as `_unchecked` above)."""
    forced = add_forced(drafts, step, room=room)
    for node in range(len(drafts.tokens) - len(forced), len(drafts.tokens)):
        drafts.probs[node] = np.zeros_like(drafts.probs[node])
    return forced


def test_forced_tokens_inside_a_chain_taken_unchecked_fail_the_check(monkeypatch):
    inner = _inner_forced(monkeypatch, _unchecked_inside)
    # At T 1.5 the verifier takes the other tokenization (3 then 4) after a drafted 0 often enough to show.
    tally, law = _grammar_tally(_forced, _settings(1.5), seed=44, n_sequences=6000, length=PLANTED_LENGTH)
    assert inner
    assert _p_value(tally.counts, law) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_prompt_lookup_drafts_with_forced_tails_follow_the_masked_processed_law(monkeypatch, temperature):
    monkeypatch.setattr(test_laws, "PROMPT", LOOKUP_PROMPT)
    tail = _inner_forced(monkeypatch, module=specgguf.core.forced_drafter)
    tally, law = _grammar_tally(_after_zero, _settings(temperature), seed=45, drafter="ngram")
    assert tail  # a lookup draft cut after its 0 took the grammar's 4 after it
    assert _p_value(tally.counts, law) > 1e-4


def test_forced_tails_taken_unchecked_fail_the_check(monkeypatch):
    monkeypatch.setattr(test_laws, "PROMPT", LOOKUP_PROMPT)
    tail = _inner_forced(monkeypatch, _unchecked_inside, module=specgguf.core.forced_drafter)
    tally, law = _grammar_tally(
        _after_zero, _settings(0.5), seed=46, n_sequences=4000, drafter="ngram", length=PLANTED_LENGTH
    )
    assert tail
    assert _p_value(tally.counts, law) < 1e-12


@pytest.mark.slow
def test_a_draft_reporting_q_without_temperature_under_a_grammar_fails_the_check(monkeypatch):
    monkeypatch.setattr(ModelDrafter, "propose", _misreporting("temperature"))
    tally, law = _grammar_tally(
        _forced, _settings(0.5), seed=43, n_sequences=PLANT_SEQUENCES["temperature"], length=PLANTED_LENGTH
    )
    assert _p_value(tally.counts, law) < 1e-12
