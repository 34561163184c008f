"""Drafters (model with early stop, n-gram prompt lookup, hybrid) and the K policies."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel, one_hot_logits
from specgguf.drafting import HybridDrafter, ModelDrafter, NgramDrafter, build_drafter
from specgguf.engine import StepEvent, speculate
from specgguf.kpolicy import AdaptiveK, adaptive_policy, expected_tokens
from specgguf.sampling import SamplingSettings

GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def _propose(drafter, context, k, settings=GREEDY, n_vocab=20):
    return drafter.propose(context, k, n_vocab=n_vocab, settings=settings, rng=np.random.default_rng(0))


def test_ngram_continues_the_longest_most_recent_match():
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    context = [5, 6, 7, 8, 9, 1, 6, 7, 4, 2, 5, 6, 7]
    # Suffix [5, 6, 7] (3 tokens) occurred at the start: propose what followed it.
    assert _propose(drafter, context, 3).tokens == [8, 9, 1] and drafter.last_match == 3
    # Only [.., 6, 7] matches (twice): the most recent occurrence wins.
    assert _propose(drafter, [6, 7, 8, 3, 6, 7, 4, 0, 6, 7], 2).tokens == [4, 0]
    assert _propose(drafter, [1, 2, 3, 4], 3).tokens == [] and drafter.last_match == 0


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

    drafts = ModelDrafter(model).propose([1, 1], 8, n_vocab=20, settings=GREEDY, rng=np.random.default_rng(0),
                                         keep_drafting=keep_drafting)
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
    assert hybrid.next_source([1, 2, 3, 4, 8, 2, 3]) == "draft"
    drafts = _propose(hybrid, [1, 2, 3, 4, 8, 2, 3], 2)  # only a 2-token match
    assert drafts.source == "draft" and drafts.tokens == [9, 9]


def test_hybrid_policy_learns_each_drafters_k_apart():
    policy = adaptive_policy("hybrid", k_max=8)
    model_policy, ngram_policy = policy.policies["draft"], policy.policies["ngram"]
    assert policy.choose("draft") == 0  # warm-up: one plain step, seen by both
    policy.observe(_step(0, 0, verify=0.035))
    assert ngram_policy.verify_costs == {0: 0.035}
    # The draft model is wrong at once and costs as much as a plain step per draft ...
    for _ in range(30):
        policy.observe(_step(2, 0, verify=0.075, draft=0.035, confidences=[0.9, 0.9]))
    # ... while n-gram drafts are free and right.
    for _ in range(30):
        policy.observe(_step(4, 4, verify=0.11, draft=0.00001, source="ngram"))
    assert model_policy.drafted[0] > 10 and ngram_policy.drafted[0] > 10  # decayed counts
    assert model_policy.accepted.sum() == 0 and ngram_policy.accepted[0] == ngram_policy.drafted[0]
    assert policy.choose("draft") == 0 and policy.choose("ngram") >= 4
    assert policy.keep_drafting([0.99]) == model_policy.keep_drafting([0.99])


def test_build_drafter_by_name():
    model = FakeModel(one_hot_logits(lambda c: 1, 5), n_vocab=5)
    assert isinstance(build_drafter("ngram", None), NgramDrafter)
    assert isinstance(build_drafter("hybrid", model), HybridDrafter)
    assert build_drafter("model", None) is None


def test_ngram_drafter_speeds_up_repetitive_text_and_stays_the_verifiers_output():
    # The verifier repeats 1..6 forever: after one cycle every n-gram proposal is right.
    cycle = lambda context: context[-1] % 6 + 1  # noqa: E731
    verifier = FakeModel(one_hot_logits(cycle, 10), n_vocab=10)
    events = list(speculate(verifier=verifier, drafter=NgramDrafter(), prompt_tokens=[1, 2, 3, 4, 5, 6, 1],
                            k=5, max_tokens=30, settings=GREEDY, rng=np.random.default_rng(0)))
    context = [1]
    for _ in range(30):
        context.append(cycle(context))
    assert [t for event in events for t in event.tokens] == context[1:]
    assert len(events) <= 6  # 6 tokens per step instead of 1


# --- K choice on recorded timing data -------------------------------------------------
# Seconds measured on this project's 2-core machine with the Qwen2.5-Coder pair
# (0.5B Q4_K_M draft): one draft token 0.040 s; verifying 1 and 9 tokens:
RECORDED = {"q4_k_m": {0: 0.074, 8: 0.266}, "f16": {0: 0.199, 8: 0.336}}
DRAFT_SECONDS = 0.040


def _policy_after(verify_costs, acceptance_pattern, *, k_min=0):
    """Feed a policy the steps it asks for: verify cost interpolated between the recorded
    batch sizes, each step accepting the given number of drafts."""
    policy = AdaptiveK(k_max=12, k_min=k_min)
    for n_accepted in acceptance_pattern:
        k = policy.choose()
        policy.observe(_step(k, min(n_accepted, k), verify=_recorded_verify(verify_costs, k), draft=DRAFT_SECONDS))
    return policy


def _recorded_verify(verify_costs, k):
    """Seconds to verify k drafts, interpolated between the recorded batch sizes."""
    return verify_costs[0] + (verify_costs[8] - verify_costs[0]) * k / 8


def test_memory_bound_verifier_with_a_good_draft_speculates_deeply():
    policy = _policy_after(RECORDED["f16"], [8, 8, 7, 8, 8, 6, 8, 8] * 3)
    assert policy.choose() >= 6


def test_compute_bound_verifier_falls_back_to_plain():
    # Half the first drafts fail: one draft yields 1.5 tokens for 0.138 s, plain 1 for 0.074 s.
    policy = _policy_after(RECORDED["q4_k_m"], [1, 0, 2, 0, 1, 0] * 4)
    assert policy.choose() == 0


def _policy_with_first_draft_accepted(times: int, of: int) -> AdaptiveK:
    policy = AdaptiveK(k_max=12, decay=1.0)
    policy.observe(_step(0, 0, verify=RECORDED["f16"][0]))
    for i in range(of):
        policy.observe(_step(2, 1 if i < times else 0, verify=RECORDED["f16"][0] + 0.034))
    return policy


def test_plain_only_once_the_evidence_is_in():
    # One first draft in ten accepted: the point estimate says plain either way, but after
    # ten drafts two standard errors of doubt still favour speculating; after thirty they do not.
    few, many = _policy_with_first_draft_accepted(1, of=10), _policy_with_first_draft_accepted(3, of=30)
    for policy in (few, many):
        assert np.argmax(policy.expected_by_k() / policy.step_seconds()) == 0
    assert few.best_k() >= 1
    assert many.best_k() == 0


def test_verify_cost_line_leaves_the_single_token_batch_apart():
    policy = AdaptiveK(k_max=8)
    # One token through matrix-vector kernels is cheaper than the line through the batches.
    policy.verify_costs = {0: 0.079, 1: 0.124, 4: 0.166, 8: 0.222}
    v0, v1 = policy.verify_line()
    assert v1 == pytest.approx(0.014, abs=0.001) and v0 == pytest.approx(0.110, abs=0.002)
    np.testing.assert_allclose(policy.verify_seconds(np.array([0, 2])), [0.079, v0 + 2 * v1])
    policy.verify_costs = {0: 0.2, 8: 0.34}  # one batch size with drafts: the line through plain's point
    assert policy.verify_line() == pytest.approx((0.2, 0.0175))


def _confident_policy(verify_plain: float, verify_per_draft: float) -> AdaptiveK:
    """A policy that has learnt: drafts of top probability >= 0.9 are accepted, those under 0.5 are not."""
    policy = AdaptiveK(k_max=16, decay=1.0, calibration_decay=1.0)
    policy.observe(_step(0, 0, verify=verify_plain))
    for k, confidences in [(4, [0.99, 0.95, 0.3, 0.97]), (6, [0.99] * 5 + [0.2]), (3, [0.92, 0.4, 0.9])]:
        n_accepted = next((i for i, c in enumerate(confidences) if c < 0.5), k)
        policy.observe(_step(k, n_accepted, verify=verify_plain + verify_per_draft * k, draft=0.02,
                             confidences=confidences))
    return policy


def test_calibration_counts_only_the_drafts_the_rule_tested():
    policy = _confident_policy(0.08, 0.014)
    # (4 drafts, 2 accepted) tests 3; (6, 5) tests 6; (3, 1) tests 2: 11 tested, 8 accepted.
    assert policy.tried_by_confidence.sum() == 11 and policy.accepted_by_confidence.sum() == 8
    assert policy.calibrated(0.99) > 0.9 and policy.calibrated(0.3) < 0.2


def test_keep_drafting_follows_confidence_and_costs():
    memory_bound, compute_bound = _confident_policy(0.08, 0.014), _confident_policy(0.035, 0.03)
    assert memory_bound.choose() == memory_bound.k_max  # K is a cap; the draft's confidence ends the draft
    for policy in (memory_bound, compute_bound):
        assert not policy.keep_drafting([0.99, 0.3])  # an unsure draft ends it
    # A long confident run: on a memory-bound verifier another draft is nearly free.
    assert memory_bound.keep_drafting([0.99] * 8)
    # Verifying one more token costs nearly as much as a plain step: stop sooner.
    assert not compute_bound.keep_drafting([0.99] * 2 + [0.9] * 2)
    assert memory_bound.keep_drafting([0.99] * 2 + [0.9] * 2)


def test_a_policy_that_never_saw_confidence_keeps_the_chosen_length():
    policy = _policy_after(RECORDED["f16"], [8, 8, 7, 8] * 3)
    assert not policy.confidence_seen and policy.keep_drafting([0.1])


def test_force_spec_never_chooses_plain():
    policy = _policy_after(RECORDED["q4_k_m"], [3, 2, 4, 1, 3, 2] * 4, k_min=1)
    assert policy.choose() >= 1


def test_plain_fallback_probes_again_less_often_while_probes_lose():
    policy = _policy_after(RECORDED["q4_k_m"], [1, 0, 1, 0] * 4)

    def losing_step(k):
        policy.observe(_step(k, 0, verify=_recorded_verify(RECORDED["q4_k_m"], k), draft=DRAFT_SECONDS))

    while (k := policy.choose()) != 0:  # until the evidence says plain
        losing_step(k)
    losing_step(0)
    probes, since = [], 1
    for _ in range(16 + 32 + 64 + 128 + 10):
        k = policy.choose()
        since += 1
        if k:
            probes.append((since, k))
            since = 0
        losing_step(k)  # every probe loses
    gaps = [gap for gap, _ in probes]
    assert gaps[0] <= 16 and gaps[1:] == [32, 64, 128]  # 16 plain steps in all before the first
    assert all(k <= 2 for _, k in probes)  # short probes: verifying costs here


def test_a_cold_first_timing_does_not_dominate_and_plain_is_remeasured():
    policy = AdaptiveK(k_max=8)
    for seconds in (0.2, 0.08, 0.08, 0.08):  # the first step after prompt ingestion runs cold
        policy.observe(_step(0, 0, verify=seconds))
    assert policy.verify_costs[0] == pytest.approx(0.11)
    policy = _policy_after(RECORDED["f16"], [8] * 10)
    choices = []
    for _ in range(70):
        choices.append(policy.choose())
        policy.observe(_step(choices[-1], choices[-1], verify=RECORDED["f16"][0] + 0.017 * choices[-1]))
    plain_at = [i for i, k in enumerate(choices) if k == 0]
    assert len(plain_at) == 2 and plain_at[1] - plain_at[0] == policy.replain_every + 1


def test_no_probes_where_even_perfect_drafts_would_lose():
    # Measured here with the Q4_K_M verifier: plain 35 ms, 2 tokens 59 ms, 3 tokens 78 ms;
    # a draft token 20 ms. Two drafts, both right, give 3 tokens in 118 ms: 25 tok/s < 28.6.
    policy = AdaptiveK(k_max=16)
    policy.observe(_step(0, 0, verify=0.035))
    for k, verify in [(1, 0.059), (2, 0.078)] * 10:
        policy.observe(_step(k, 0, verify=verify, draft=0.020))
    assert not policy.could_win()
    assert [policy.choose() for _ in range(300)] == [0] * 300


def test_a_winning_probe_resets_the_wait():
    policy = _policy_after(RECORDED["f16"], [0] * 30)
    assert policy.choose() == 0
    policy.probe_interval = 64  # after a few lost probes
    choices = []
    for _ in range(200):  # the text became easy: every draft is accepted
        choices.append(policy.choose())
        policy.observe(_step(choices[-1], choices[-1], verify=RECORDED["f16"][0] + 0.017 * choices[-1]))
    assert choices[-1] > 0 and policy.probe_interval == policy.probe_every
    assert choices.count(0) < 64 + 32  # won back after a probe or two


@pytest.mark.parametrize("acceptance, k, expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 2, 1.75)])
def test_expected_tokens_per_step(acceptance, k, expected):
    assert expected_tokens(acceptance, k) == pytest.approx(expected)


def _step(k, n_accepted, *, verify=0.2, draft=0.04, confidences=(), source="draft"):
    return StepEvent(accepted=[1] * n_accepted, rejected=[2] * (k - n_accepted), verifier_token=3, n_drafted=k,
                     n_accepted=n_accepted, draft_seconds=draft * k, verify_seconds=verify, sample_seconds=0.0,
                     draft_source=source if k else None, draft_confidence=list(confidences))


def test_per_position_acceptance_counts_only_positions_the_rule_tested():
    policy = AdaptiveK(k_max=4, decay=1.0)
    for n_accepted in (4, 4, 1, 0):
        policy.observe(_step(4, n_accepted))
    # Tested: all 4 positions twice, positions 1-2 once, position 1 once.
    np.testing.assert_array_equal(policy.drafted, [4, 3, 2, 2])
    np.testing.assert_array_equal(policy.accepted, [3, 2, 2, 2])
    # Each position shrunk towards the one before it, the first towards the overall rate.
    c1 = (3 + 2 * 10 / 13) / (4 + 2)  # overall: (9 accepted + 1) / (11 tested + 2)
    c2 = (2 + 2 * c1) / (3 + 2)
    c3 = (2 + 2 * c2) / (2 + 2)
    c4 = (2 + 2 * c3) / (2 + 2)
    conditional = np.array([c1, c2, c3, c4])
    np.testing.assert_allclose(policy.expected_by_k(), [1, *(1 + np.cumsum(np.cumprod(conditional)))])


def test_bursty_acceptance_is_modelled_per_position():
    # Either the first draft is wrong, or all eight are right: once position 1 is
    # accepted every later one is, so after a plain-step warm-up deep drafts pay off.
    policy = AdaptiveK(k_max=8, decay=1.0)
    policy.observe(_step(0, 0, verify=0.20))
    for n_accepted in [0, 8] * 10:
        policy.observe(_step(8, n_accepted, verify=0.34))
    first = (10 + 2 * 81 / 92) / 22  # shrunk towards the overall rate, (80 + 1) / (90 + 2)
    later = [first]
    for _ in range(7):
        later.append((10 + 2 * later[-1]) / 12)  # each towards the position before
    assert policy.expected_by_k()[8] == pytest.approx(1 + np.cumprod(later).sum())
    assert policy.best_k() == 8


# --- a measured verify-cost table (verify_costs.py) --------------------------------------
# Seconds to verify 1..17 tokens, measured here with the Q4_K_M verifier: irregular, a batch
# of 16 costs less than one of 12.
Q4_TABLE = [0.037, 0.0605, 0.079, 0.0959, 0.1184, 0.1402, 0.1646, 0.2297, 0.2464, 0.262, 0.2994,
            0.2918, 0.3095, 0.3213, 0.3415, 0.2782, 0.3277]


def test_a_verify_table_finds_the_cheap_batch_shape_a_line_misses():
    # Free n-gram drafts, each right 95% of the time (given the earlier ones were), and the
    # verify costs of batches up to 7 tokens seen so far. The table knows 16 tokens cost 278 ms
    # and drafts 15; the line through the small batches predicts 20% more and stays short.
    choices = {}
    for name, table in (("table", np.array(Q4_TABLE)), ("line", None)):
        policy = AdaptiveK(k_max=16, source="ngram", verify_profile=table, draft_cost=0.0002)
        policy.verify_costs = {k: Q4_TABLE[k] for k in range(7)}
        policy.drafted = np.full(16, 20.0)
        policy.accepted = 0.95 * policy.drafted
        choices[name] = policy.best_k()
        if table is None:
            assert policy.verify_seconds([15])[0] > 1.15 * Q4_TABLE[15]
    assert choices == {"table": 15, "line": 4}


def test_a_verify_table_is_scaled_by_what_the_steps_measure():
    policy = AdaptiveK(k_max=16, decay=1.0, verify_profile=np.array(Q4_TABLE))
    policy.observe(_step(0, 0, verify=0.040))
    for k in (2, 4, 2, 4):  # the machine runs 20% slower than when the table was measured
        policy.observe(_step(k, k, verify=1.2 * Q4_TABLE[k]))
    # The table itself counts as `profile_trust` (3) steps at scale 1: one slow step moves it little.
    scale = (3 * 1.0 + 4 * 1.2) / 7
    assert policy.profile_scale == pytest.approx(scale)
    np.testing.assert_allclose(policy.verify_seconds([0, 7, 15]), [0.040, scale * Q4_TABLE[7], scale * Q4_TABLE[15]])
    # Past the table's end: extended by its last step.
    short = AdaptiveK(k_max=8, verify_profile=np.array([0.03, 0.05, 0.06]))
    np.testing.assert_allclose(short.verify_seconds([2, 4]), [0.06, 0.08])


def test_keep_drafting_looks_past_the_tables_next_step():
    policy = _confident_policy(Q4_TABLE[0], 0.02)
    policy.draft_cost = 0.005
    # 14 drafts verify as 15 tokens: 341 ms, 16 tokens only 278. A line (+20 ms a token) stops
    # at a so-so 14th draft; the table sees the cheaper batch one draft on.
    assert not policy.keep_drafting([0.99] * 13 + [0.8])
    policy.verify_profile, policy.profile_scale = np.array(Q4_TABLE), 1.0
    assert policy.keep_drafting([0.99] * 13 + [0.8])
    # A 7th draft makes the batch 8 tokens, 65 ms more than 7. A confident run is still worth
    # taking past that jump (the batches after it cost little more); an unsure draft is not.
    assert policy.keep_drafting([0.99] * 6)
    assert not policy.keep_drafting([0.99] * 5 + [0.5])
