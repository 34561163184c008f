"""The string-level cross-vocabulary drafter (core/string_drafter.py) through `core.engine.speculate`, with
test_cross_vocab_laws.py's scripted fakes of two vocabularies that split text differently: the draft's
text re-encoded by the verifier's (longest-match) tokenizer, proposed as point masses. The output's law
is the verifier's at T 1, at T 0.5/1.5 with top-k/top-p/min-p, and under a grammar; planted wrong rules
(the draft's own probability as q, a residual that keeps x) must fail the check the drafter passes,
and re-encoding without the context window must fail the text check the drafter passes.
"""

from __future__ import annotations

import numpy as np
import pytest

import specgguf.core.engine
import specgguf.core.string_drafter
from fakes import FakeModel, TextVocab
from specgguf.core.cross_drafter import CrossVocab, VerifierText
from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.drafting import DraftStep
from specgguf.core.engine import FixedK, speculate
from specgguf.core.sampling import SamplingSettings, accept_tree, sample_token
from specgguf.core.string_drafter import StringDrafter, reencode
from specgguf.errors import UsageError
from test_cross_vocab_laws import DRAFT_PIECES, DRAFT_TABLE, DRAFT_VOCAB, VERIFIER_PIECES, _map
from test_grammar_laws import GRAMMARS, LENGTH as GRAMMAR_LENGTH
from test_laws import LENGTH, PROMPT, TARGET, VOCAB, _law, _p_value, _settings, _tally

VERIFIER_VOCAB = TextVocab(VERIFIER_PIECES)


def _cross(mode="string") -> CrossVocab:
    verifier_text = VerifierText(VERIFIER_VOCAB.tokenize, VERIFIER_PIECES)
    return CrossVocab(
        _map(), VERIFIER_PIECES, DRAFT_PIECES, DRAFT_VOCAB.tokenize, mode=mode, verifier_text=verifier_text
    )


def _drafter(context_window=1, **options) -> StringDrafter:
    """(A window of one token: the fake verifier's own text is rarely its longest-match tokenizer's,
    and a window that does not come back unchanged drafts nothing.)"""
    draft = FakeModel(lambda context: DRAFT_TABLE[context[-1]], n_vocab=len(DRAFT_PIECES))
    cross = _cross()
    assert cross.verifier_text is not None
    return StringDrafter(draft, cross, cross.verifier_text, context_window=context_window, **options)


def test_the_drafter_table_builds_it_in_string_mode():
    draft = FakeModel(lambda context: DRAFT_TABLE[context[-1]], n_vocab=len(DRAFT_PIECES))
    built = build_drafter("cross", draft, DraftSettings(p_min=0.25, cross=_cross()))
    assert isinstance(built, StringDrafter) and built.p_min == 0.25 and built.model is draft
    tokens_mode = build_drafter("cross", draft, DraftSettings(cross=_cross("tokens")))
    assert not isinstance(tokens_mode, StringDrafter)
    bare = CrossVocab(_map(), VERIFIER_PIECES, DRAFT_PIECES, DRAFT_VOCAB.tokenize, mode="string")
    with pytest.raises(UsageError, match="verifier's tokenizer"):
        build_drafter("cross", draft, DraftSettings(cross=bare))


def _text(tokens) -> bytes:
    return b"".join(VERIFIER_PIECES[token] for token in tokens)


def _proposals(drafter, n_steps=300, seed=0):
    """(context, proposed tokens) over random contexts, sampled at T 1."""
    rng = np.random.default_rng(seed)
    settings = SamplingSettings(temperature=1.0)
    for _ in range(n_steps):
        context = [int(token) for token in rng.integers(0, VOCAB, size=int(rng.integers(1, 7)))]
        drafts = drafter.propose(context, 4, DraftStep(n_vocab=VOCAB, settings=settings, rng=rng))
        assert all(row[token] == 1.0 and row.sum() == 1.0 for token, row in zip(drafts.tokens, drafts.probs))
        assert len(drafts.confidence) == len(drafts.tokens) and drafts.text_seconds >= 0.0
        yield context, drafts.tokens


def _text_violations(drafter) -> int:
    """Steps whose proposal is not the verifier's own encoding of its text after the context's window:
    re-encoding the window's text with the proposal's must give back the window and the proposal."""
    bad = 0
    for context, tokens in _proposals(drafter):
        window = context[-drafter.context_window :]
        bad += bool(tokens) and VERIFIER_VOCAB.tokenize(_text(window + tokens)) != window + tokens
    return bad


def test_proposals_are_the_verifiers_own_encoding_in_context():
    drafter = _drafter()
    assert _text_violations(drafter) == 0
    assert sum(bool(tokens) for _, tokens in _proposals(drafter, seed=1)) > 100  # it does propose


def _no_window(verifier, context, text, *, window):
    return real_reencode(verifier, context, text, window=0)


real_reencode = reencode


def test_re_encoding_without_the_context_window_fails_the_text_check(monkeypatch):
    """`a` then the draft's `b`: alone it re-encodes to `b`, but after `a` the verifier's text is `ab`."""
    monkeypatch.setattr(specgguf.core.string_drafter, "reencode", _no_window)
    assert _text_violations(_drafter()) > 10


def test_greedy_output_is_the_verifiers_argmax():
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    events = speculate(verifier=verifier, drafter=_drafter(), prompt_tokens=PROMPT, k=FixedK(4), max_tokens=40,
                       settings=SamplingSettings(temperature=0.0), rng=np.random.default_rng(1))  # fmt: skip
    events = list(events)
    context = list(PROMPT)
    for _ in range(40):
        context.append(int(np.argmax(TARGET[context[-1]])))
    assert [token for event in events for token in event.tokens] == context[len(PROMPT) :]
    assert sum(event.n_drafted for event in events) > 0


def _string_p_value(settings, *, seed, n_sequences=20_000, **options):
    tally = _tally(_drafter(**options), FixedK(3), settings, length=LENGTH, seed=seed, n_sequences=n_sequences)
    assert tally.sources == {"model"}
    return _p_value(tally.counts, _law(settings, LENGTH))


def test_sampled_sequences_follow_the_law_at_temperature_one():
    assert _string_p_value(SamplingSettings(temperature=1.0), seed=52, n_sequences=8000) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 1.5])
def test_sampled_sequences_follow_the_verifiers_processed_law(temperature):
    assert _string_p_value(_settings(temperature), seed=51, hold="always") > 1e-4


@pytest.mark.parametrize("grammar", ["forced", "tool-call"])
def test_under_a_grammar_the_law_is_the_masked_verifiers(grammar):
    settings = SamplingSettings(temperature=1.0)
    tally = _tally(
        _drafter(), FixedK(3), settings, length=GRAMMAR_LENGTH, seed=55, n_sequences=8000, grammar=GRAMMARS[grammar]
    )
    assert "model" in tally.sources
    assert _p_value(tally.counts, _law(settings, GRAMMAR_LENGTH, GRAMMARS[grammar]())) > 1e-4


# --- planted wrong rules: each must fail the check above ------------------------------------


def _drafts_own_probability(propose):
    """q(x) reported as the draft's own probability of its text (its confidence), not 1: the engine
    then accepts with min(1, p(x)/q_draft(x)) and subtracts q_draft from p on a rejection."""

    def planted(self, context, k, step):
        drafts = propose(self, context, k, step)
        drafts.probs = [row * chance for row, chance in zip(drafts.probs, drafts.confidence)]
        return drafts

    return planted


def _residual_keeps_x(*, target_probs, draft_probs, draft_tokens, parents, rng):
    """Accept x with p(x), but on a rejection draw from p itself, x included."""
    node, path = -1, []
    for child in range(len(draft_tokens)):
        p = target_probs(node)
        if rng.random() < p[draft_tokens[child]]:
            path.append(child)
            node = child
            continue
        return path, sample_token(p, rng)
    return path, sample_token(target_probs(node), rng)


def test_accepting_with_the_drafts_own_probability_fails_the_check(monkeypatch):
    monkeypatch.setattr(StringDrafter, "propose", _drafts_own_probability(StringDrafter.propose))
    assert _string_p_value(SamplingSettings(temperature=1.0), seed=53, n_sequences=8000) < 1e-12


def test_a_residual_that_keeps_x_fails_the_check(monkeypatch):
    monkeypatch.setattr(specgguf.core.engine, "accept_tree", _residual_keeps_x)
    assert _string_p_value(SamplingSettings(temperature=1.0), seed=54, n_sequences=8000) < 1e-12


def test_the_engines_rule_with_a_one_hot_q_is_p_then_p_without_x():
    """core/sampling.accept_tree on a point mass: accept x with p(x); else p with x removed, renormalised."""
    target = np.array([0.5, 0.3, 0.2])
    one_hot = np.array([0.0, 1.0, 0.0])
    rng = np.random.default_rng(3)
    n, outcomes = 40_000, np.zeros(3)
    for _ in range(n):
        path, token = accept_tree(
            target_probs=lambda node: target, draft_probs=[one_hot], draft_tokens=[1], parents=[-1], rng=rng
        )
        assert path or token != 1  # a rejection never writes x
        outcomes[1 if path else token] += 1
    assert outcomes / n == pytest.approx(target, abs=0.01)
