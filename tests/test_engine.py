"""The draft/verify loop against fake models with scripted logits."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

import specgguf.core.engine as engine
from fakes import FakeModel, one_hot_logits
from specgguf.core.costs import MachineCosts
from specgguf.core.drafters import HybridDrafter
from specgguf.core.drafting import DRAFT_READ_PRIOR, LONG_READ, Reading
from specgguf.core.engine import FixedK, speculate
from specgguf.core.hot_vocab import HotVocab
from specgguf.core.kpolicy import PolicyConfig, adaptive_policy
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.errors import ContextFullError, PromptError

VOCAB = 10
EOS = 9
GREEDY = SamplingSettings(temperature=0.0)


def counting(context):
    """The verifier counts 1, 2, ..., 8, 1, 2, ... and never ends on its own."""
    return context[-1] % 8 + 1


def sometimes_wrong(context):
    """A draft that agrees with `counting` except after every multiple of 3."""
    return 1 if context[-1] % 3 == 0 else counting(context)


def _models(verifier_choice=counting, draft_choice=counting, *, n_ctx=256):
    verifier = FakeModel(one_hot_logits(verifier_choice, VOCAB), n_vocab=VOCAB, n_ctx=n_ctx, eog=[EOS])
    draft = FakeModel(one_hot_logits(draft_choice, VOCAB), n_vocab=VOCAB, n_ctx=n_ctx, eog=[EOS])
    return verifier, draft


def _run(verifier, draft, *, k, max_tokens=20, prompt=(1,), settings=GREEDY, seed=0, kind="model"):
    drafter = _drafter(kind, draft) if draft is not None else None
    events = list(
        speculate(
            verifier=verifier,
            drafter=drafter,
            prompt_tokens=list(prompt),
            k=k,
            max_tokens=max_tokens,
            settings=settings,
            rng=np.random.default_rng(seed),
        )
    )
    return events, [token for event in events for token in event.tokens]


def _plain_greedy(choice, prompt, n):
    context = list(prompt)
    for _ in range(n):
        context.append(choice(context))
    return context[len(prompt) :]


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_greedy_output_is_the_verifiers_and_caches_are_rolled_back(k):
    verifier, draft = _models(draft_choice=sometimes_wrong)
    events, tokens = _run(verifier, draft, k=k, max_tokens=25)
    assert tokens == _plain_greedy(counting, [1], 25)
    assert events[-1].stop == "max_tokens"
    context = [1] + tokens
    # Each cache holds a prefix of the true context: rejected drafts were rolled back.
    assert verifier.cache == context[: len(verifier.cache)]
    assert draft.cache == context[: len(draft.cache)]
    assert any(event.rejected for event in events)
    for event in events:
        assert event.n_accepted == len(event.accepted) <= event.n_drafted <= k
        assert len(event.tokens) == event.n_accepted + 1


def test_newest_token_rides_in_the_verify_batch():
    verifier, draft = _models(draft_choice=sometimes_wrong)
    events, _ = _run(verifier, draft, k=4, prompt=(1, 2, 3))
    prompt_call, *step_calls = verifier.eval_calls
    assert prompt_call == [1, 2, 3]  # its last row scores the answer's first token: the first step makes no pass
    first, *later = events
    assert not first.n_drafted and len(first.tokens) == 1  # out as soon as the prompt is read
    assert [len(call) for call in step_calls] == [1 + event.n_drafted for event in later]
    assert any(event.n_drafted for event in later)


def test_plain_decoding_takes_its_first_token_from_the_prompt_pass():
    verifier, _ = _models()
    events, tokens = _run(verifier, None, k=0, prompt=(1, 2, 3), max_tokens=6)
    assert tokens == _plain_greedy(counting, [1, 2, 3], 6)
    # The prompt's pass, then one pass per token after the first: n tokens cost n - 1 passes.
    assert verifier.eval_calls == [[1, 2, 3], *([token] for token in tokens[:-1])]
    # Each token is the argmax of the row its event reports (the first: the prompt pass's last row).
    for event in events:
        assert event.target_logits is not None
        assert [int(np.argmax(row)) for row in event.target_logits] == event.tokens


def test_all_accepted_gives_a_bonus_token_and_the_draft_catches_up():
    verifier, draft = _models()
    events, tokens = _run(verifier, draft, k=4, max_tokens=15)
    # The prompt pass's token, then 4 drafts and a bonus a step (the last cut to the answer's room).
    assert [len(event.tokens) for event in events] == [1, 5, 5, 4]
    assert all(event.n_accepted == len(event.tokens) - 1 and not event.rejected for event in events)
    # The draft never saw its 4th draft; it arrives with the bonus token in one call.
    assert draft.eval_calls[4] == [tokens[4], tokens[5]]  # after [1, 2] (the prompt and the first token), [3], [4], [5]


def test_eos_inside_an_accepted_draft_ends_generation():
    ends_after_4 = lambda context: EOS if context[-1] == 4 else counting(context)  # noqa: E731
    verifier, draft = _models(ends_after_4, ends_after_4)
    events, tokens = _run(verifier, draft, k=8)
    assert tokens == [2, 3, 4]
    # After the first token (the prompt pass's): 3, 4, EOS drafted, and drafting stopped at EOS.
    assert events[-1].stop == "eos" and events[-1].n_drafted == 3


def test_eos_drafted_but_refused_goes_on():
    verifier, draft = _models(draft_choice=lambda context: EOS if context[-1] == 4 else counting(context))
    _, tokens = _run(verifier, draft, k=3, max_tokens=10)
    assert tokens == _plain_greedy(counting, [1], 10)


def test_full_context_stops_cleanly():
    verifier, draft = _models(n_ctx=12)
    events, tokens = _run(verifier, draft, k=8, max_tokens=100, prompt=(1, 2, 3))
    assert events[-1].stop == "context"
    assert tokens == _plain_greedy(counting, [1, 2, 3], len(tokens))
    assert len(tokens) == 12 - 3 + 1  # the last token is predicted from a full cache


def test_prompt_longer_than_context_and_empty_prompt_are_errors():
    verifier, draft = _models(n_ctx=4)
    with pytest.raises(ContextFullError, match="prompt is 5 tokens"):
        _run(verifier, draft, k=2, prompt=(1, 2, 3, 4, 5))
    with pytest.raises(PromptError):
        _run(verifier, draft, k=2, prompt=())


def test_k_zero_and_no_draft_decode_with_the_verifier_alone():
    for draft_model in (None, _models()[1]):
        verifier, _ = _models()
        events, tokens = _run(verifier, draft_model, k=0, max_tokens=6)
        assert tokens == _plain_greedy(counting, [1], 6)
        assert all(event.n_drafted == 0 for event in events) and len(events) == 6
        if draft_model is not None:
            assert draft_model.eval_calls == []  # never asked to draft: it reads nothing, not even the prompt


class ModelLater(FixedK):
    """K 0 for the draft model for the first `n_plain` steps (it cannot win here), then `k`; the
    n-gram drafter's steps always get `k`."""

    def __init__(self, k, n_plain):
        super().__init__(k)
        self.n_plain, self.n_steps = n_plain, 0

    def choose(self, source="model"):
        return self.k if source != "model" or self.n_steps >= self.n_plain else 0

    def observe(self, event):
        self.n_steps += 1


@pytest.mark.parametrize("kind", ["model", "hybrid"])
def test_the_draft_model_reads_nothing_until_it_drafts_then_catches_up_on_the_whole_context(kind):
    prompt = (1, 2, 3, 4, 5, 6)  # counting: the n-gram side finds matches once the count wraps
    verifier, draft = _models(draft_choice=sometimes_wrong)
    never, _ = _run(verifier, draft, k=ModelLater(3, n_plain=10**6), max_tokens=20, prompt=prompt, kind=kind)
    assert draft.eval_calls == []  # the draft model was never picked: it evaluated nothing
    assert kind == "model" or any(event.draft_source == "ngram" for event in never)
    verifier, draft = _models(draft_choice=sometimes_wrong)
    events, tokens = _run(verifier, draft, k=ModelLater(3, n_plain=2), max_tokens=30, prompt=prompt, kind=kind)
    assert tokens == _plain_greedy(counting, prompt, 30)
    first = next(i for i, event in enumerate(events) if event.draft_source == "model")
    context = [*prompt, *(token for event in events[:first] for token in event.tokens)]
    # Its first call reads the whole context but the newest token (which its first draft row takes).
    assert draft.eval_calls[0] == context[:-1] and draft.eval_calls[1] == context[-1:]
    assert events[first].draft_catchup_seconds > 0 and not any(event.draft_catchup_seconds for event in events[:first])
    assert draft.cached == [*prompt, *tokens][: draft.n_past]  # and after: a prefix of the context


LONG = [*(1 + i % 7 for i in range(LONG_READ + 1)), 7]  # ends in (2, 7): nothing for the n-gram side to copy


@pytest.mark.parametrize("kind", ["model", "hybrid"])
def test_a_draft_model_reads_a_long_prompt_only_once_the_answer_has_run_as_long(kind, monkeypatch):
    # The reading is priced at 10 ms a token, a plain step at what it takes (a fake's: well under
    # 10 ms), so the 65-token catch-up waits for steps worth 650 ms: none in a 12-token answer.
    monkeypatch.setattr(engine.Reading, "after_prefill", classmethod(lambda cls, seconds, n, measured=None: cls(0.01)))
    verifier, draft = _models(draft_choice=sometimes_wrong, n_ctx=512)
    events, tokens = _run(verifier, draft, k=3, max_tokens=12, prompt=LONG, kind=kind)
    assert tokens == _plain_greedy(counting, LONG, 12)
    assert draft.eval_calls == [] and all(event.draft_source != "model" for event in events)
    # Once the answer has taken as long as the reading would, the draft reads and drafts.
    monkeypatch.setattr(engine.Reading, "after_prefill", classmethod(lambda cls, seconds, n, measured=None: cls(1e-9)))
    verifier, draft = _models(draft_choice=sometimes_wrong, n_ctx=512)
    events, tokens = _run(verifier, draft, k=3, max_tokens=12, prompt=LONG, kind=kind)
    assert tokens == _plain_greedy(counting, LONG, 12)
    assert events[0].draft_source is None and not events[0].draft_catchup_seconds  # nothing waited yet
    assert events[1].draft_source == "model" and events[1].draft_catchup_seconds > 0
    assert draft.eval_calls[0] == LONG  # the whole context but its newest token (8)
    assert events[1].draft_catchup_tokens == len(LONG)  # (a long read: not what a probe catches up on)
    # A short prompt is read at once: the first step that drafts (the second: the first is the prompt
    # pass's token) drafts with the model.
    short, _ = _run(*_models(draft_choice=sometimes_wrong), k=3, max_tokens=12, prompt=LONG[1:], kind=kind)
    assert short[0].draft_source is None and short[1].draft_source == "model"


def test_prompt_lookup_drafts_from_the_first_step_that_can_after_a_long_prompt(monkeypatch):
    monkeypatch.setattr(engine.Reading, "after_prefill", classmethod(lambda cls, seconds, n, measured=None: cls(0.01)))
    prompt = [1 + i % 8 for i in range(LONG_READ + 1)]  # counting goes on as the prompt repeats
    events, tokens = _run(*_models(), k=3, max_tokens=8, prompt=prompt, kind="hybrid")
    assert tokens == _plain_greedy(counting, prompt, 8) and events[1].draft_source == "ngram"


def test_the_reading_rule_waits_for_the_answer_then_learns_the_measured_cost():
    reading = Reading.after_prefill(2.0, 100)  # the verifier read 100 tokens in 2 s: a draft token 10 ms
    assert reading.per_token == pytest.approx(DRAFT_READ_PRIOR * 0.02)
    assert not reading.defers(LONG_READ)  # a short read happens at once
    assert reading.defers(200)  # 200 tokens: 2 s at the prior, nothing waited yet
    reading.observe(0.7, 0.0, 0)
    # 0.7 s waited, and the step about to run priced as the last one took: 1.4 s; 130 tokens (1.3 s) are read
    assert reading.defers(200) and not reading.defers(130)
    reading.observe(0.8, 1.0, 200)  # the draft read 200 tokens in 1 s: 5 ms a token from now on
    # 1.5 s waited and 0.8 s to come: 400 tokens (2 s) are read, 500 (2.5 s) wait
    assert reading.per_token == pytest.approx(0.005) and not reading.defers(400) and reading.defers(500)
    # A short read (the verifier's cache held the rest of the prompt): its rate is still the prior, so a
    # long prompt the draft never read waits (a short one is read at once, as above).
    short = Reading.after_prefill(0.2, 16)
    assert short.per_token == pytest.approx(DRAFT_READ_PRIOR * 0.0125) and short.defers(300)
    assert not short.defers(LONG_READ) and Reading.after_prefill(0.0, 0).per_token == 0.0
    # The draft's own reading, timed on this machine, replaces the prior.
    assert Reading.after_prefill(2.0, 100, measured=0.004).per_token == 0.004


def test_the_reading_waits_until_the_rent_paid_reaches_its_price():
    # Ski rental: not having read loses 1 − 1/s of each second; the draft reads on the step whose rent
    # would bring it up to the reading's price (here 2 s), that step priced as the last one took. At s = 2
    # the rent is half of each second: 4 s of answer, the fourth 1.1 s step reads.
    reading = Reading(per_token=0.01)
    reading.observe(1.1, 0.0, 0)
    reading.observe(1.1, 0.0, 0)
    assert reading.defers(200, lambda: 2.0) and not reading.defers(200)  # unknown s: the whole second is rent
    reading.observe(1.1, 0.0, 0)
    assert not reading.defers(200, lambda: 2.0) and reading.defers(200, lambda: 1.25)  # at 1.25×: 10 s
    reading.observe(6.0, 0.0, 0)
    assert not reading.defers(200, lambda: 1.25)
    # Drafting that cannot beat plain decoding never buys a long read; a short one is still read at once,
    # without asking the policy.
    assert reading.defers(200, lambda: 1.0) and reading.defers(200, lambda: 0.8)
    assert not reading.defers(LONG_READ, lambda: pytest.fail("asked for a short read"))


def test_a_long_read_waits_for_the_policys_speedup(monkeypatch):
    # The same answer as above, reading priced at 1 ns a token (read at once with s unknown): a policy
    # that expects no gain from the draft model never reads the long prompt.
    monkeypatch.setattr(engine.Reading, "after_prefill", classmethod(lambda cls, seconds, n, measured=None: cls(1e-9)))

    class NoGain(FixedK):
        def speedup(self, source):
            return 1.0 if source == "model" else None

    verifier, draft = _models(draft_choice=sometimes_wrong, n_ctx=512)
    events, tokens = _run(verifier, draft, k=NoGain(3), max_tokens=12, prompt=LONG, kind="model")
    assert tokens == _plain_greedy(counting, LONG, 12)
    assert draft.eval_calls == [] and all(event.draft_source != "model" for event in events)
    verifier, draft = _models(draft_choice=sometimes_wrong, n_ctx=512)
    events, _ = _run(verifier, draft, k=3, max_tokens=12, prompt=LONG, kind="model")
    assert events[1].draft_source == "model" and draft.eval_calls[0] == LONG


def test_max_tokens_is_exact():
    verifier, draft = _models()
    for max_tokens in (1, 2, 5, 9):
        _, tokens = _run(*_models(), k=4, max_tokens=max_tokens)
        assert len(tokens) == max_tokens


def test_a_draft_with_a_smaller_vocabulary_is_padded():
    verifier, _ = _models()
    small_draft = FakeModel(one_hot_logits(lambda context: counting(context) % 7, VOCAB - 2), n_vocab=VOCAB - 2)
    events, tokens = _run(verifier, small_draft, k=3, max_tokens=40, settings=SamplingSettings(temperature=0.7))
    assert len(tokens) == 40
    assert all(token < VOCAB - 2 for event in events for token in event.accepted + event.rejected)


# --- Losslessness under sampling, through the whole loop, with every drafter ----------

MARKOV_VOCAB = 3
SEQUENCE_LENGTH = 3
MARKOV_PROMPT = [0, 1, 2, 0, 1]  # repeats, so the n-gram drafter has something to propose


def _markov_table(seed):
    """log next-token probabilities given the previous token."""
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(MARKOV_VOCAB), size=MARKOV_VOCAB))


HOT_IDS = np.array([0, 2])  # a hot-vocabulary draft: token 1 is outside it (q = 0) ...
HOT_FEED = np.array([0, 0, 1])  # ... and read as token 0 where it is in the context


def _drafter(kind, draft_model):
    if kind == "model":
        return ModelDrafter(draft_model)
    if kind == "ngram":
        return NgramDrafter(min_ngram=1)
    return HybridDrafter(ModelDrafter(draft_model), NgramDrafter(min_ngram=1), min_match=2)


class ConfidenceStop(FixedK):
    """Three drafts at most, stopping after the first whose top probability is under 0.5:
    the draft length depends on what the draft sampled, as with `AdaptiveK.keep_drafting`."""

    def __init__(self):
        super().__init__(3)
        self.answers = set()

    def keep_drafting(self, confidences):
        self.answers.add(confidences[-1] >= 0.5)
        return confidences[-1] >= 0.5

    branches = False

    def branch(self, confidences, runner_up):
        return False

    def observe(self, event):
        pass


class Siblings(ConfidenceStop):
    """Three drafts, a sibling beside each where the draft was unsure (so the tree's shape
    depends on what the draft sampled); remembers whether sampled siblings were ever taken."""

    def __init__(self):
        super().__init__()
        self.taken = set()
        self.branches = True

    def keep_drafting(self, confidences):
        return True

    def branch(self, confidences, runner_up):
        return confidences[-1] < 0.9

    def observe(self, event):
        self.taken.update(taken for _, taken in event.sides)


CHEAP_DRAFTS = MachineCosts((0.03, 0.04, 0.05, 0.06), draft=0.001)
FORCED_K3 = PolicyConfig(k_max=3, k_min=1)


def _sequence_p_value(kind, policy, seed, n_sequences=20_000):
    """Chi-square p-value of SEQUENCE_LENGTH-token answers through the engine against their exact
    law under the verifier alone, and the sources that drafted."""
    target_table, draft_table = _markov_table(1), _markov_table(2)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    verifier = FakeModel(lambda context: target_table[context[-1]], n_vocab=MARKOV_VOCAB)
    if kind == "hot":  # the draft over HOT_IDS only, as core/hot_vocab.HotVocab shows it to the loop
        inner = FakeModel(lambda context: draft_table[HOT_IDS[context[-1]]][HOT_IDS], n_vocab=len(HOT_IDS))
        drafter = ModelDrafter(HotVocab(inner, HOT_IDS, HOT_FEED))
    else:
        drafter = _drafter(kind, FakeModel(lambda context: draft_table[context[-1]], n_vocab=MARKOV_VOCAB))
    rng = np.random.default_rng(seed)
    counts = np.zeros((MARKOV_VOCAB,) * SEQUENCE_LENGTH)
    sources = set()
    for _ in range(n_sequences):
        events = list(
            speculate(
                verifier=verifier,
                drafter=drafter,
                prompt_tokens=MARKOV_PROMPT,
                k=policy,
                max_tokens=SEQUENCE_LENGTH,
                settings=settings,
                rng=rng,
            )
        )
        counts[tuple(t for event in events for t in event.tokens)] += 1
        sources.update(event.draft_source for event in events if event.n_drafted)
    target = np.exp(target_table)
    expected = np.einsum("a,ab,bc->abc", target[MARKOV_PROMPT[-1]], target, target)
    return chisquare(counts.ravel(), expected.ravel() * n_sequences).pvalue, sources


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, policy",
    [
        ("model", FixedK(3)),
        ("hot", FixedK(3)),
        ("ngram", FixedK(3)),
        ("hybrid", FixedK(3)),
        ("model", ConfidenceStop()),
        ("hybrid", ConfidenceStop()),
        ("hybrid", adaptive_policy("hybrid", CHEAP_DRAFTS, FORCED_K3)),
        ("model", Siblings()),
        ("hybrid", Siblings()),
    ],
    ids=[
        "model",
        "hot-vocabulary",
        "ngram",
        "hybrid",
        "model-confidence-stop",
        "hybrid-confidence-stop",
        "hybrid-adaptive",
        "model-tree",
        "hybrid-tree",
    ],
)
def test_sampled_sequences_follow_the_verifiers_joint_distribution(kind, policy):
    p_value, sources = _sequence_p_value(kind, policy, seed=5)
    assert p_value > 1e-4
    assert sources == {"model": {"model"}, "hot": {"model"}, "ngram": {"ngram"}, "hybrid": {"model", "ngram"}}[kind]
    if isinstance(policy, Siblings):
        assert policy.taken == {True, False}  # siblings were both taken and refused
    elif isinstance(policy, ConfidenceStop):
        assert policy.answers == {True, False}  # drafts were both cut short and continued


class AlwaysBranch(FixedK):
    branches = True

    def branch(self, confidences, runner_up):
        return True


def _runner_up_is_right(context):
    """The draft: `sometimes_wrong` first, the verifier's `counting` a close second."""
    logits = np.zeros(VOCAB)
    logits[counting(context)] = 4.0
    logits[sometimes_wrong(context)] = 5.0
    return logits


def test_greedy_tree_takes_the_sibling_the_verifier_wants_and_keeps_both_caches_right():
    verifier, _ = _models()
    draft = FakeModel(_runner_up_is_right, n_vocab=VOCAB, eog=[EOS])
    chain_events, chain_output = _run(verifier, draft, k=FixedK(4), max_tokens=30)
    verifier, _ = _models()
    draft = FakeModel(_runner_up_is_right, n_vocab=VOCAB, eog=[EOS])
    events, output = _run(verifier, draft, k=AlwaysBranch(4), max_tokens=30)
    assert output == chain_output == _plain_greedy(counting, [1], 30)
    assert verifier.tree_calls and sum(event.siblings_accepted for event in events) > 0
    # Where the chain breaks, the sibling is what the verifier wanted: one more token that pass.
    assert events[1].accepted == chain_events[1].accepted + [chain_events[1].verifier_token]  # (0: the prompt pass's)
    context = [1, *output]
    assert verifier.cached == context[: verifier.n_past] and draft.cached == context[: draft.n_past]


@pytest.mark.slow
def test_the_wrong_tree_rule_fails_the_loops_distribution_check(monkeypatch):
    """The control for the tree cases above: the same loop with siblings each tested against the
    verifier's unchanged distribution must fail."""
    import specgguf.core.engine
    from test_sampling import _wrong_tree_rule

    monkeypatch.setattr(specgguf.core.engine, "accept_tree", _wrong_tree_rule)
    p_value, _ = _sequence_p_value("model", AlwaysBranch(3), seed=6)
    assert p_value < 1e-12


@pytest.mark.slow
def test_a_verifier_masked_to_the_drafts_vocabulary_fails_the_hot_vocabulary_check(monkeypatch):
    """The control for the hot-vocabulary case: the bug vocabulary trimming invites, the verifier's
    distribution cut to the tokens the draft can propose, must fail the same check."""
    import specgguf.core.engine
    from specgguf.core.sampling import accept_tree

    def masked(*, target_probs, draft_probs, draft_tokens, parents, rng):
        support = draft_probs[0] > 0 if len(draft_probs) else True  # no drafts: nothing to cut to

        def cut(node):
            p = target_probs(node) * support
            return p / p.sum()

        return accept_tree(
            target_probs=cut, draft_probs=draft_probs, draft_tokens=draft_tokens, parents=parents, rng=rng
        )

    monkeypatch.setattr(specgguf.core.engine, "accept_tree", masked)
    p_value, _ = _sequence_p_value("hot", FixedK(3), seed=7)
    assert p_value < 1e-12


class ScriptedSeconds:
    """An adaptive policy that sees each step take what `costs` says (the fakes take no time),
    and records the K it chose (for prompt lookup's whole proposals, how many it verified)."""

    def __init__(self, policy, costs: MachineCosts):
        self.policy, self.costs = policy, costs
        self.chosen: list[int] = []
        self.branches = False

    def choose(self, source="model"):
        self.chosen.append(self.policy.choose(source))
        return self.chosen[-1]

    def keep_drafting(self, confidences):
        return self.policy.keep_drafting(confidences)

    def worth(self, confidences):
        self.chosen[-1] = self.policy.worth(confidences)  # a whole proposal: the drafts verified are the step's K
        return self.chosen[-1]

    def branch(self, confidences, runner_up):
        return False

    def speedup(self, source):
        return self.policy.speedup(source)

    def read_seconds(self, source):
        return self.policy.read_seconds(source)

    def clock(self, event, elapsed):
        return self.policy.clock(event, elapsed)

    def observe(self, event):
        k, table = event.n_drafted, self.costs.verify
        event.verify_seconds = table[min(k, len(table) - 1)] + max(0, k - len(table) + 1) * 0.02
        event.draft_seconds = self.costs.draft * k if event.draft_source == "model" else 0.0
        self.policy.observe(event)


def test_greedy_output_does_not_depend_on_what_the_costs_taught():
    # A prior 4x too high on a compute-bound machine: the policy drafts, learns, stops, probes;
    # whatever K it chooses, the output is the verifier's.
    true = MachineCosts((0.0335, 0.052, 0.066, 0.079, 0.095, 0.117), draft=0.0205)
    busy = MachineCosts(tuple(4 * c for c in true.verify[:1]) + true.verify[1:], draft=true.draft)
    for kind in ("model", "ngram", "hybrid"):
        verifier, draft = _models(draft_choice=sometimes_wrong)
        policy = ScriptedSeconds(adaptive_policy(kind, busy, PolicyConfig(k_max=8)), true)
        events, tokens = _run(verifier, draft, k=policy, max_tokens=200, kind=kind)
        assert tokens == _plain_greedy(counting, [1], 200)
        # The drafts' length changed as the costs were learned (a draft model's is the cap its confidence
        # ends, `keep_drafting`; a lookup's what `worth` verifies of its proposal).
        assert len({event.n_drafted for event in events}) >= 3
