"""The cross-vocabulary drafter's output law, through `core.engine.speculate` with scripted fakes of
two different vocabularies (test_laws.py's harness and verifier): text the two split differently
(`abc` is one draft token, two verifier tokens; `ca` one verifier token, two draft tokens), verifier
tokens the draft cannot propose, draft tokens the verifier lacks. Planted wrong rules (q not
renormalised over the intersection, p cut to the intersection) must fail the check the drafter passes.
"""

from __future__ import annotations

import numpy as np
import pytest

import specgguf.core.cross_drafter
import specgguf.core.engine
from fakes import FakeModel, TextVocab
from specgguf.core.cross_drafter import CrossVocab, CrossVocabDrafter
from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.drafting import DraftStep
from specgguf.core.engine import FixedK, speculate
from specgguf.core.sampling import SamplingSettings, accept_tree, sparse_distribution
from specgguf.core.vocab_map import NORMAL, VocabMap, VocabPieces, build_vocab_map
from specgguf.errors import UsageError
from test_grammar_laws import GRAMMARS, LENGTH as GRAMMAR_LENGTH
from test_laws import LENGTH, PROMPT, TARGET, VOCAB, _law, _p_value, _settings, _tally

VERIFIER_PIECES = [b"a", b"b", b"c", b"ab", b"ca", b"cc"]  # test_laws' six-token verifier
DRAFT_PIECES = [b"bb", b"ab", b"c", b"abc", b"a", b"ba", b"b"]  # ids in another order than the verifier's
DRAFT_VOCAB = TextVocab(DRAFT_PIECES)
DRAFT_TABLE = np.log(np.random.default_rng(7).dirichlet(np.full(len(DRAFT_PIECES), 2.0), size=len(DRAFT_PIECES)))


def _map() -> VocabMap:
    def pieces(texts):
        return VocabPieces(tuple(texts), (NORMAL,) * len(texts))

    return build_vocab_map(pieces(DRAFT_PIECES), pieces(VERIFIER_PIECES))


def _drafter(window: int = 2) -> CrossVocabDrafter:
    draft = FakeModel(lambda context: DRAFT_TABLE[context[-1]], n_vocab=len(DRAFT_PIECES))
    cross = CrossVocab(
        _map(), verifier_pieces=VERIFIER_PIECES, draft_pieces=DRAFT_PIECES, tokenize=DRAFT_VOCAB.tokenize
    )
    return CrossVocabDrafter(draft, cross, window=window)


def test_the_drafter_table_builds_it_from_the_pairs_map():
    draft = FakeModel(lambda context: DRAFT_TABLE[context[-1]], n_vocab=len(DRAFT_PIECES))
    cross = _drafter().map, VERIFIER_PIECES, DRAFT_PIECES, DRAFT_VOCAB.tokenize
    built = build_drafter("cross", draft, DraftSettings(p_min=0.5, cross=CrossVocab(*cross, mode="tokens")))
    assert isinstance(built, CrossVocabDrafter) and built.p_min == 0.5 and built.model is draft
    assert build_drafter("cross", None, DraftSettings()) is None  # no draft model
    with pytest.raises(UsageError, match="vocabulary map"):
        build_drafter("cross", draft, DraftSettings())


def test_the_map_is_the_shared_text():
    vocab_map = _map()
    assert vocab_map.to_verifier.tolist() == [-1, 3, 2, -1, 0, -1, 1]
    assert vocab_map.overlap == pytest.approx(4 / 6)


def test_a_draft_row_is_a_distribution_over_the_intersection_of_verifier_ids():
    drafter, settings = _drafter(), SamplingSettings(temperature=1.0)
    rng = np.random.default_rng(0)
    for context in ([0, 1, 2], [4, 5], [3, 3, 0]):
        drafts = drafter.propose(list(context), 3, DraftStep(n_vocab=VOCAB, settings=settings, rng=rng))
        assert drafts.tokens and len(drafts.probs) == len(drafts.tokens)
        for token, row in zip(drafts.tokens, drafts.probs):
            assert row.sum() == pytest.approx(1.0) and row[[4, 5]].sum() == 0.0 and row[token] > 0.0


def test_moved_boundaries_are_read_again():
    """`a` then `b` is the draft's `ab`; then `c` makes `abc`; a verifier's `ca` splits in two. With a
    window the draft's tokens are its own tokenization of the whole text; with none they go stale."""
    drafter, stale = _drafter(window=2), _drafter(window=0)
    step = DraftStep(n_vocab=VOCAB, settings=SamplingSettings(temperature=0.0), rng=np.random.default_rng(0))
    context: list[int] = []
    for token in [0, 1, 2, 4, 5, 3, 0]:
        context.append(token)
        text = b"".join(VERIFIER_PIECES[t] for t in context)
        for each in (drafter, stale):
            each.propose(list(context), 2, step)
        assert drafter.tokens == DRAFT_VOCAB.tokenize(text)
        assert DRAFT_VOCAB.text(stale.tokens) == text
        # The draft's cache holds the agreed tokens (all but the newest) and then its drafts.
        assert drafter.model.cached[: len(drafter.tokens) - 1] == drafter.tokens[:-1]
    assert stale.tokens != DRAFT_VOCAB.tokenize(text)  # e.g. `a`,`b` never re-read as `ab`


def test_greedy_output_is_the_verifiers_argmax():
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    settings = SamplingSettings(temperature=0.0)
    rng = np.random.default_rng(1)

    def tokens(drafter):
        events = speculate(verifier=verifier, drafter=drafter, prompt_tokens=PROMPT, k=FixedK(4), max_tokens=40,
                           settings=settings, rng=rng)  # fmt: skip
        return [token for event in events for token in event.tokens]

    context = list(PROMPT)
    for _ in range(40):
        context.append(int(np.argmax(TARGET[context[-1]])))
    assert tokens(_drafter()) == context[len(PROMPT) :]


def _cross_p_value(settings, *, seed, n_sequences=20_000):
    drafter = _drafter()
    tally = _tally(drafter, FixedK(3), settings, length=LENGTH, seed=seed, n_sequences=n_sequences)
    assert tally.sources == {"model"}
    return _p_value(tally.counts, _law(settings, LENGTH))


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 1.5])
def test_sampled_sequences_follow_the_verifiers_processed_law(temperature):
    assert _cross_p_value(_settings(temperature), seed=41) > 1e-4


def test_sampled_sequences_follow_the_law_at_temperature_one():
    assert _cross_p_value(SamplingSettings(temperature=1.0), seed=42, n_sequences=8000) > 1e-4


# --- planted wrong rules: each must fail the check above ------------------------------------


def _not_renormalised(logits, shared, settings):
    """The draft's processed row over all its tokens, then cut to the intersection: the token is
    still drawn from the renormalised row (sample_token normalises), but q is reported short."""
    support, weights = sparse_distribution(logits, settings)
    return support[shared[support]], weights[shared[support]]


def _p_cut_to_the_intersection(*, target_probs, **kwargs):
    covered = _map().verifier_covered

    def cut(node):
        probs = np.where(covered, target_probs(node), 0.0)
        return probs / probs.sum()

    return accept_tree(target_probs=cut, **kwargs)


def test_q_not_renormalised_over_the_intersection_fails_the_check(monkeypatch):
    monkeypatch.setattr(specgguf.core.cross_drafter, "intersection_distribution", _not_renormalised)
    assert _cross_p_value(SamplingSettings(temperature=1.0), seed=43, n_sequences=8000) < 1e-12


def test_p_cut_to_the_intersection_fails_the_check(monkeypatch):
    monkeypatch.setattr(specgguf.core.engine, "accept_tree", _p_cut_to_the_intersection)
    assert _cross_p_value(SamplingSettings(temperature=1.0), seed=44, n_sequences=8000) < 1e-12


@pytest.mark.parametrize("grammar", ["forced", "tool-call"])
def test_under_a_grammar_the_law_is_the_masked_verifiers(grammar):
    """A grammar's masks are over verifier ids: the draft proposes only what the mask allows of the
    intersection (test_grammar_laws.py's grammars and law)."""
    settings = SamplingSettings(temperature=1.0)
    tally = _tally(
        _drafter(), FixedK(3), settings, length=GRAMMAR_LENGTH, seed=45, n_sequences=8000, grammar=GRAMMARS[grammar]
    )
    assert tally.sources == {"model", "grammar"}
    assert _p_value(tally.counts, _law(settings, GRAMMAR_LENGTH, GRAMMARS[grammar]())) > 1e-4
