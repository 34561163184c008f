"""Drafters (model with early stop, n-gram prompt lookup, hybrid) and the K policies."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel, one_hot_logits
from specgguf.core.drafters import HybridDrafter, build_drafter
from specgguf.core.drafting import DraftStep
from specgguf.core.engine import speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_cache import SessionNgrams
from specgguf.core.ngram_drafter import Match, NgramDrafter
from specgguf.core.sampling import SamplingSettings

GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def _propose(drafter, context, k, settings=GREEDY, n_vocab=20):
    return drafter.propose(context, k, DraftStep(n_vocab=n_vocab, settings=settings, rng=np.random.default_rng(0)))


def test_ngram_continues_the_longest_most_recent_match():
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    context = [5, 6, 7, 8, 9, 1, 6, 7, 4, 2, 5, 6, 7]
    # Suffix [5, 6, 7] (3 tokens) occurred at the start: propose what followed it.
    assert _propose(drafter, context, 3).tokens == [8, 9, 1] and drafter.lookup(context, 3) == Match([8, 9, 1], 3)
    # Only [.., 6, 7] matches (twice): the most recent occurrence wins.
    assert _propose(drafter, [6, 7, 8, 3, 6, 7, 4, 0, 6, 7], 2).tokens == [4, 0]
    assert _propose(drafter, [1, 2, 3, 4], 3).tokens == [] and drafter.lookup([1, 2, 3, 4], 3) == Match()


def test_ngram_proposal_is_one_hot_under_sampling():
    drafts = _propose(NgramDrafter(min_ngram=1), [1, 2, 3, 1, 2], 2, settings=SAMPLED, n_vocab=6)
    assert drafts.tokens == [3, 1] and drafts.source == "ngram"
    np.testing.assert_array_equal(np.array(drafts.probs), np.eye(6)[[3, 1]])


def _unsure_after_3(context):
    """Confident (one-hot-ish) except after token 3, where two tokens tie."""
    logits = np.zeros(20)
    if context[-1] == 3:
        logits[[4, 5]] = 5.0
    else:
        logits[(context[-1] + 1) % 20] = 8.0
    return logits


def test_early_stop_at_low_draft_confidence_respects_the_minimum():
    model = FakeModel(_unsure_after_3, n_vocab=20)
    model.eval([1], n_logits=0)
    assert _propose(ModelDrafter(model, p_min=0.75), [1, 1], 8).tokens == [2, 3]  # stops before the tie
    model.rewind(1)
    assert _propose(ModelDrafter(model, p_min=0.75, n_min=4), [1, 1], 8).tokens[:3] == [2, 3, 4]
    model.rewind(1)
    assert len(_propose(ModelDrafter(model, p_min=0.0), [1, 1], 8).tokens) == 8


def test_draft_reports_its_confidence_and_stops_when_the_policy_says_so():
    model = FakeModel(_unsure_after_3, n_vocab=20)
    model.eval([1], n_logits=0)
    asked = []

    def keep_drafting(confidences):
        asked.append(list(confidences))
        return confidences[-1] > 0.9

    step = DraftStep(n_vocab=20, settings=GREEDY, rng=np.random.default_rng(0), keep_drafting=keep_drafting)
    drafts = ModelDrafter(model).propose([1, 1], 8, step)
    # After 3 the two tied tokens each get about half: the policy stops after that draft.
    assert drafts.tokens == [2, 3, 4]
    confident = 1 / (1 + 19 * np.exp(-8.0))
    np.testing.assert_allclose(drafts.confidence, [confident, confident, 1 / (2 + 18 * np.exp(-5.0))])
    assert asked == [drafts.confidence[:1], drafts.confidence[:2], drafts.confidence]


def test_hybrid_uses_ngram_on_long_matches_and_the_model_otherwise():
    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    hybrid = HybridDrafter(ModelDrafter(model), NgramDrafter(min_ngram=1), min_match=3)
    assert hybrid.next_source([1, 2, 3, 4, 1, 2, 3]) == "ngram"
    assert _propose(hybrid, [1, 2, 3, 4, 1, 2, 3], 2).source == "ngram"
    assert hybrid.next_source([1, 2, 3, 4, 8, 2, 3]) == "model"
    drafts = _propose(hybrid, [1, 2, 3, 4, 8, 2, 3], 2)  # only a 2-token match
    assert drafts.source == "model" and drafts.tokens == [9, 9]


def test_hybrid_looks_up_once_per_step_and_anew_when_the_context_changes():
    class CountingNgrams(NgramDrafter):
        calls = 0

        def lookup(self, context: list[int], k: int) -> Match:
            CountingNgrams.calls += 1
            return super().lookup(context, k)

    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    hybrid = HybridDrafter(ModelDrafter(model), CountingNgrams(min_ngram=1), min_match=3)
    context = [1, 2, 3, 4, 5, 1, 2, 3]
    assert hybrid.next_source(context) == "ngram"
    assert _propose(hybrid, context, 2).tokens == [4, 5]  # the same step's lookup, cut to K
    assert _propose(hybrid, context, 3).tokens == [4, 5, 1]
    assert CountingNgrams.calls == 1
    context.append(4)  # the next step: looked up again
    assert _propose(hybrid, context, 1).tokens == [5] and CountingNgrams.calls == 2
    hybrid.prepare(context)  # a new answer (another prompt boundary): never the last answer's match
    hybrid.next_source(context)
    assert CountingNgrams.calls == 3


def test_build_drafter_by_name():
    model = FakeModel(one_hot_logits(lambda c: 1, 5), n_vocab=5)
    assert isinstance(build_drafter("ngram", None), NgramDrafter)
    assert isinstance(build_drafter("hybrid", model), HybridDrafter)
    assert build_drafter("model", None) is None


def test_ngram_drafter_speeds_up_repetitive_text_and_stays_the_verifiers_output():
    # The verifier repeats 1..6 forever: after one cycle every n-gram proposal is right.
    cycle = lambda context: context[-1] % 6 + 1  # noqa: E731
    verifier = FakeModel(one_hot_logits(cycle, 10), n_vocab=10)
    events = list(
        speculate(
            verifier=verifier,
            drafter=NgramDrafter(),
            prompt_tokens=[1, 2, 3, 4, 5, 6, 1],
            k=5,
            max_tokens=30,
            settings=GREEDY,
            rng=np.random.default_rng(0),
        )
    )
    context = [1]
    for _ in range(30):
        context.append(cycle(context))
    assert [t for event in events for t in event.tokens] == context[1:]
    assert len(events) <= 6  # 6 tokens per step instead of 1


def test_session_cache_drafts_where_the_context_has_no_match_and_learns_each_turn_once():
    session = SessionNgrams()
    drafter = NgramDrafter(session=session)
    # An earlier answer taught the session "3 4 -> 5 6 7"; this prompt has no match of its own.
    session.learn([1, 3, 4, 5, 6, 7, 8])
    drafter.prepare([9, 3, 4])
    assert _propose(drafter, [9, 3, 4], 3).tokens == [5, 6, 7]
    # Generated tokens are learned as the verifier settles on them (sync), once.
    context = [9, 3, 4, 5, 10, 11]
    drafter.sync(context)
    assert session.lookup([5, 10], 1) == ([11], 2)
    counted = len(session)
    drafter.sync(context)  # nothing new
    assert len(session) == counted
    # The next chat turn repeats the conversation: only its new tail is counted.
    next_turn = context + [12, 13]
    drafter.prepare(next_turn)
    assert session.lookup([11, 12], 1) == ([13], 2)
    again = SessionNgrams()
    again.learn(next_turn)
    assert len(session) >= len(again)  # the first answer's n-grams are in it too
    # The context's own match comes first, the session only where it has none.
    assert _propose(drafter, [3, 4, 20, 21, 3, 4], 2).tokens == [20, 21]


def test_hybrid_takes_long_session_matches_and_feeds_the_session():
    session = SessionNgrams()
    session.learn([1, 2, 3, 4, 5, 6])
    model = FakeModel(one_hot_logits(lambda context: 0, 20), n_vocab=20)
    model.eval([7], n_logits=0)
    hybrid = HybridDrafter(ModelDrafter(model), NgramDrafter(session=session), min_match=3)
    drafts = _propose(hybrid, [7, 2, 3, 4], 2)
    assert drafts.source == "ngram" and drafts.tokens == [5, 6]
    hybrid.prepare([7, 8, 9, 10])
    assert session.lookup([8, 9], 1) == ([10], 2)


def _hashed_logits(context):
    """A draft whose rows depend on the whole context (so a cache holding a wrong token shows)."""
    return np.random.default_rng(hash(tuple(context)) % (1 << 32)).normal(0.0, 2.0, 20)


def _own_chain(context, n):
    """The draft's greedy continuation of `context`."""
    chain = []
    for _ in range(n):
        chain.append(int(np.argmax(_hashed_logits(context + chain))))
    return chain


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_read_ahead_drafts_what_the_draft_model_drafts_in_fewer_passes(settings):
    """Guesses right, then wrong, of every length: the drafts (tokens, q rows, confidences) are the ones
    drafting without guesses gives with the same random draws, the cache keeps only right guesses, and
    right guesses save passes."""
    calls = {"plain": 0, "ahead": 0}
    for trial in range(40):
        context = [int(t) for t in np.random.default_rng(trial).integers(0, 20, 6)]
        right = trial % 5  # how many guessed tokens are the draft's own (greedy) continuation
        guess, start = _own_chain(context, 8)[:right] + [7, 7, 7], len(context)

        def guesser(sequence, k, guess=guess, start=start):
            done = sequence[start:]
            rest = guess[len(done) :] if guess[: len(done)] == done else []
            return rest[:k], [0.9] * len(rest[:k])

        results = {}
        for name, drafter in (
            ("plain", ModelDrafter(FakeModel(_hashed_logits, n_vocab=20))),
            ("ahead", ModelDrafter(FakeModel(_hashed_logits, n_vocab=20), guess=guesser)),
        ):
            drafts = drafter.propose(
                context, 6, DraftStep(n_vocab=20, settings=settings, rng=np.random.default_rng(trial))
            )
            model = drafter.model
            assert model.cached == (context + drafts.tokens)[: len(model.cached)]  # every token in it is right
            assert len(model.eval_calls) == 1 + len(drafts.tokens) - drafts.read_ahead  # the catch-up, then passes
            calls[name] += len(model.eval_calls)
            results[name] = drafts
        plain, ahead = results["plain"], results["ahead"]
        assert ahead.tokens == plain.tokens and ahead.confidence == plain.confidence
        np.testing.assert_array_equal(np.array(ahead.probs), np.array(plain.probs))
    assert calls["ahead"] < calls["plain"]


def test_read_ahead_reads_a_guess_only_while_its_chance_pays():
    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    read = []
    drafter = ModelDrafter(model, guess=lambda sequence, k: ([9, 9, 9, 9][:k], [0.9, 0.5, 0.5, 0.9][:k]))
    original = model.eval

    def eval(tokens, *, n_logits):
        read.append(list(tokens))
        return original(tokens, n_logits=n_logits)

    model.eval = eval
    assert _propose(drafter, [1, 2], 4).tokens == [9, 9, 9, 9]
    # Reach 0.9, then 0.45 (both read), then 0.225 (below 0.25: not read): three drafts from the first
    # pass; the fourth and last needs no guess after it (nothing is read past the last draft).
    assert read == [[1, 2, 9, 9], [9]]


def test_guesses_never_drawn_stop_being_read_and_drawn_ones_read_further():
    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    wrong = ModelDrafter(model, guess=lambda sequence, k: ([5] * k, [0.55] * k))
    passes = []
    for _ in range(6):
        before = len(model.eval_calls)
        assert _propose(wrong, [1, 2], 4).tokens == [9] * 4
        passes.append([len(call) for call in model.eval_calls[before:]])
    # Reach 0.55, then 0.3: two guesses read after the pending token; each is refused, and the
    # evidence's word counts less and less: in the end every draft is one pass of one token.
    assert passes[0][0] == 4 and passes[-1] == [1, 1, 1, 1]
    assert wrong.guess_chances.chance(0.55) < 0.25
    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    right = ModelDrafter(model, guess=lambda sequence, k: ([9] * k, [0.4] * k))
    assert len(model.eval([1], n_logits=1)) == 1
    first = len(_propose(right, [1, 2], 8).tokens) and model.eval_calls[1]
    for _ in range(6):
        _propose(right, [1, 2], 8)
    assert right.guess_chances.chance(0.4) > 0.8
    before = len(model.eval_calls)
    assert _propose(right, [1, 2], 8).tokens == [9] * 8
    assert len(first) == 2 and len(model.eval_calls[before]) > 4  # 0.4 alone at first; several read at once later
