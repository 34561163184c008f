"""The adaptive K policy (kpolicy.py) on costs measured on this project's 2-core machine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specgguf.core.costs import MachineCosts
from specgguf.core.engine import StepEvent
from specgguf.core.kpolicy import AdaptiveK, PolicyConfig, adaptive_policy
from specgguf.core.rounds import expected_at

# Seconds to verify 1, 2, … tokens with Qwen2.5-Coder 1.5B, and one 0.5B Q4_K_M draft token
# (costs.probe's table). The Q4_K_M verifier is compute-bound: a draft token costs half a
# verifier token, so drafting cannot win even at 90% acceptance. F16 is memory-bound.
Q4 = MachineCosts((0.063, 0.098, 0.131, 0.160, 0.171, 0.263, 0.234, 0.376), draft=0.033)
F16 = MachineCosts((0.137, 0.141, 0.150, 0.189, 0.218, 0.205, 0.219, 0.236, 0.271), draft=0.030)
FREE_DRAFTS_CHEAP_VERIFY = MachineCosts((0.030, 0.040, 0.045, 0.050), draft=0.001)  # wins from 37% acceptance
COMPUTE_BOUND = MachineCosts((0.030, 0.050, 0.065, 0.080), draft=0.002)  # wins only from 73% acceptance


def _step(k, n_accepted, *, verify=0.2, draft=0.03, confidences=(), source="model"):
    return StepEvent(
        accepted=[1] * n_accepted,
        rejected=[2] * (k - n_accepted),
        verifier_token=3,
        n_drafted=k,
        n_accepted=n_accepted,
        draft_seconds=draft * k,
        verify_seconds=verify,
        sample_seconds=0.0,
        draft_source=source if k else None,
        draft_confidence=list(confidences),
    )


def _verify(costs: MachineCosts, k: int) -> float:
    """The table's cost, and past its end its last step's slope."""
    last = len(costs.verify) - 1
    return costs.verify[min(k, last)] + max(0, k - last) * (costs.verify[last] - costs.verify[last - 1])


def _run(policy: AdaptiveK, costs: MachineCosts, accepted_pattern):
    """Feed a policy the steps it asks for, each accepting the given number of drafts."""
    choices = []
    for n_accepted in accepted_pattern:
        k = policy.choose()
        choices.append(k)
        policy.observe(_step(k, min(n_accepted, k), verify=_verify(costs, k), draft=costs.draft))
    return choices


def test_a_pair_that_cannot_win_here_never_drafts_not_even_once():
    policy = AdaptiveK(Q4, PolicyConfig(k_max=16))
    assert not policy.could_win()
    assert [policy.choose() for _ in range(300)] == [0] * 300  # no warm-up draft, no probes


def test_a_slower_machine_later_does_not_make_drafting_look_cheaper():
    # Plain steps measure 50% over the table (a longer context, a busy machine): the draft
    # model slows alike, so the decision not to draft stands.
    policy = AdaptiveK(Q4, PolicyConfig(k_max=16))
    for _ in range(100):
        assert policy.choose() == 0
        policy.observe(_step(0, 0, verify=1.5 * Q4.verify[0]))
    assert policy.costs.scale > 1.4 and not policy.could_win()


def test_a_memory_bound_verifier_drafts_from_the_first_step_and_goes_deep():
    policy = AdaptiveK(F16, PolicyConfig(k_max=12))
    assert policy.could_win() and policy.choose() >= 1  # no plain warm-up step: costs are known
    _run(policy, F16, [8, 8, 7, 8, 8, 6, 8, 8] * 3)
    assert policy.choose() >= 6


def test_a_compute_bound_verifier_with_a_poor_draft_falls_back_to_plain():
    policy = AdaptiveK(COMPUTE_BOUND, PolicyConfig(k_max=8))
    assert policy.choose() >= 1  # drafts that are often right would win here: try them
    _run(policy, COMPUTE_BOUND, [0, 0, 1, 0] * 10)
    assert policy.choose() == 0


def test_plain_only_once_the_evidence_is_in():
    # One first draft in four accepted: the point estimate says plain, but after four drafts
    # two standard errors of doubt still favour speculating; one in ten after forty does not.
    def policy_with_first_accepted(times, of):
        policy = AdaptiveK(FREE_DRAFTS_CHEAP_VERIFY, PolicyConfig(k_max=8, decay=1.0))
        for i in range(of):
            policy.observe(_step(2, 1 if i < times else 0, verify=0.045, draft=0.001))
        return policy

    few, many = policy_with_first_accepted(1, 4), policy_with_first_accepted(4, 40)
    for policy in (few, many):
        assert np.argmax(policy.rates()) == 0
    assert few.best_k() >= 1 and many.best_k() == 0


def _confident_policy(costs: MachineCosts) -> AdaptiveK:
    """A policy that has learnt: drafts of top probability >= 0.9 are accepted, those under 0.5 not."""
    policy = AdaptiveK(costs, PolicyConfig(k_max=16, decay=1.0, calibration_decay=1.0))
    for k, confidences in [(4, [0.99, 0.95, 0.3, 0.97]), (6, [0.99] * 5 + [0.2]), (3, [0.92, 0.4, 0.9])]:
        n_accepted = next((i for i, c in enumerate(confidences) if c < 0.5), k)
        policy.observe(_step(k, n_accepted, verify=_verify(costs, k), draft=costs.draft, confidences=confidences))
    return policy


def test_calibration_counts_only_the_drafts_the_rule_tested():
    acceptance = _confident_policy(F16).acceptance
    # (4 drafts, 2 accepted) tests 3; (6, 5) tests 6; (3, 1) tests 2: 11 tested, 8 accepted.
    assert acceptance.calibrated.tried.sum() == 11 and acceptance.calibrated.right.sum() == 8
    assert acceptance.calibrated(0.99) > 0.9 and acceptance.calibrated(0.3) < 0.2


def test_keep_drafting_follows_confidence_and_costs():
    memory_bound = _confident_policy(F16)
    costly_verify = _confident_policy(MachineCosts((0.035, 0.07, 0.105, 0.14, 0.175), draft=0.004))
    assert memory_bound.choose() == 16  # K is a cap; the draft's confidence ends the draft
    for policy in (memory_bound, costly_verify):
        assert not policy.keep_drafting([0.99, 0.3])  # an unsure draft ends it
    assert memory_bound.keep_drafting([0.99] * 8)  # another draft is nearly free to verify
    # Verifying one more token costs as much as a plain step: stop sooner.
    assert not costly_verify.keep_drafting([0.99] * 2 + [0.9] * 2)
    assert memory_bound.keep_drafting([0.99] * 2 + [0.9] * 2)


def test_keep_drafting_looks_past_the_tables_next_step():
    # A batch of 6 tokens costs more than one of 7 here: a fifth draft alone does not pay for
    # its batch, but with a sixth (nearly free to verify) a confident run is worth going on with.
    policy = _confident_policy(MachineCosts((0.05, 0.06, 0.07, 0.08, 0.09, 0.20, 0.10, 0.30), draft=0.001))
    assert policy.keep_drafting([0.99] * 4)
    assert not policy.keep_drafting([0.99] * 3 + [0.3])


def test_a_draft_models_confidence_ends_its_drafts_from_the_first_step():
    # A draft model's drafters report each draft's confidence (drafting.CONFIDENT): K is a cap from the
    # first step and `keep_drafting` ends the draft (the first step used to draft K* from the prior: one
    # token on the F16 verifier where the next drafted 6-16). K* itself still says whether to draft.
    policy = AdaptiveK(F16, PolicyConfig(k_max=12))
    assert policy.choose() == 12
    _run(policy, F16, [8, 8, 7, 8] * 3)
    assert policy.choose() == 12 and 6 <= policy.best_k() < 12


def test_force_spec_never_chooses_plain():
    policy = AdaptiveK(Q4, PolicyConfig(k_max=12, k_min=1))
    assert min(_run(policy, Q4, [0, 1, 0, 0] * 6)) >= 1


def test_plain_fallback_probes_again_less_often_while_probes_lose():
    policy = AdaptiveK(COMPUTE_BOUND, PolicyConfig(k_max=8))
    choices = _run(policy, COMPUTE_BOUND, [0] * (20 + 16 + 32 + 64 + 128 + 10))
    drafted_at = [i for i, k in enumerate(choices) if k]
    first_plain = choices.index(0)
    probes = [i for i in drafted_at if i > first_plain]
    # Each lost probe doubles the wait, and none comes sooner than its price allows: a lost probe
    # costs up to 22 ms here (a draft and one more verified token), 2% of a 30 ms plain step is
    # 0.6 ms, so at least 37 plain steps between probes.
    assert policy.probe_wait() == 128 and np.diff(probes).tolist()[-3:] == [37, 64, 128]


def test_a_winning_probe_resets_the_wait():
    policy = AdaptiveK(F16, PolicyConfig(k_max=12))
    _run(policy, F16, [0] * 40)
    assert policy.choose() == 0
    policy.probe_interval = 64  # after a few lost probes
    choices = _run(policy, F16, [12] * 200)  # the text became easy: every draft is accepted
    assert choices[-1] > 0 and policy.probe_interval == policy.config.probe_every
    assert choices.count(0) < 64 + 32  # won back after a probe or two


def test_costs_follow_the_machine_and_a_cold_first_step_does_not_dominate():
    policy = AdaptiveK(Q4, PolicyConfig(k_max=16, decay=1.0))
    policy.observe(_step(2, 2, verify=5 * _verify(Q4, 2), draft=0.033))  # a cold first step
    assert policy.costs.scale == 1.0  # one step moves nothing: the table counts as 3 steps
    for k in (0, 2, 4, 2, 4, 0):  # the machine runs 20% slower than when the table was measured
        policy.observe(_step(k, k, verify=1.2 * _verify(Q4, k), draft=0.033))
    # The median of the ratios (the table's three at 1, the cold 5, six at 1.2): the cold step is outvoted.
    scale = 1.2
    assert policy.costs.scale == pytest.approx(scale)
    np.testing.assert_allclose(policy.costs.verify(np.array([0, 7])), [scale * 0.063, scale * 0.376])
    # Past the table's end: the slope of its last half, (0.376 - 0.171) / 3 per token ...
    np.testing.assert_allclose(policy.costs.verify(np.array([9])) / scale, 0.376 + 2 * 0.205 / 3)
    # ... until steps measure those batches (one step is not enough): then their own costs, interpolated between.
    policy.observe(_step(10, 10, verify=scale * 0.400))
    np.testing.assert_allclose(policy.costs.verify(np.array([10])) / scale, 0.376 + 3 * 0.205 / 3)
    for _ in range(3):
        policy.observe(_step(10, 10, verify=scale * 0.400))
    (at_7,) = policy.costs.verify(np.array([7]))
    np.testing.assert_allclose(
        policy.costs.verify(np.array([10, 9])), [scale * 0.400, at_7 + (scale * 0.400 - at_7) * 2 / 3]
    )


def test_a_prior_four_times_too_high_gives_way_to_the_measured_costs_and_k_follows():
    # A probe on a busy machine stored the verifier 4x too slow (the draft's token, timed later,
    # right): on that prior drafting looks cheap beside verifying. The machine is issue 32's
    # compute-bound Q4_K_M pair, where no draft model wins: a verify of 5 costs 2.8x one.
    true = MachineCosts((0.0335, 0.052, 0.066, 0.079, 0.095, 0.117), draft=0.0205)
    busy_probe = MachineCosts(tuple(4 * c for c in true.verify), draft=0.0205)
    rng = np.random.default_rng(3)
    policy, config = AdaptiveK(busy_probe, PolicyConfig(k_max=8)), PolicyConfig(k_max=8)
    assert policy.could_win() and not AdaptiveK(true, config).could_win()
    choices = []
    for _ in range(60):
        k = policy.choose()
        choices.append(k)
        n_accepted = next((i for i, right in enumerate(rng.random(k) < 0.7) if not right), k)
        policy.observe(_step(k, n_accepted, verify=_verify(true, k), draft=true.draft))
    # Within a few dozen steps the learned costs are the true ones, at the sizes the steps ran and
    # (by the scale they measured) at the others ...
    learned = policy.learned_costs()
    assert learned is not None and policy.costs.scale == pytest.approx(0.25, rel=0.02)
    np.testing.assert_allclose(learned.verify, true.verify, rtol=0.02)
    assert learned.draft == pytest.approx(true.draft)
    # ... and K follows: drafting stops (this pair cannot win here) and does not come back.
    assert choices[0] >= 1 and not policy.worth_drafting and choices[-30:] == [0] * 30


def test_per_position_acceptance_counts_only_positions_the_rule_tested():
    config = PolicyConfig(k_max=4, decay=1.0)
    policy = AdaptiveK(F16, config)
    for n_accepted in (4, 4, 1, 0):
        policy.observe(_step(4, n_accepted))
    acceptance = policy.acceptance
    # Tested: all 4 positions twice, positions 1-2 once, position 1 once.
    np.testing.assert_array_equal(acceptance.drafted, [4, 3, 2, 2])
    np.testing.assert_array_equal(acceptance.accepted, [3, 2, 2, 2])
    # Each position shrunk towards the one before it, the first towards the overall rate
    # (with the prior: 0.5 worth 4 drafts).
    overall = (9 + 4 * 0.5) / (11 + 4)
    c1 = (3 + 2 * overall) / (4 + 2)
    c2 = (2 + 2 * c1) / (3 + 2)
    c3 = (2 + 2 * c2) / (2 + 2)
    c4 = (2 + 2 * c3) / (2 + 2)
    np.testing.assert_allclose(acceptance.expected(), [1, *(1 + np.cumsum(np.cumprod([c1, c2, c3, c4])))])


def test_bursty_acceptance_makes_deep_drafts_pay():
    # Either the first draft is wrong, or all eight are right: once position 1 is accepted every
    # later one is, so deep drafts pay off on a memory-bound verifier.
    policy = AdaptiveK(F16, PolicyConfig(k_max=8, decay=1.0))
    for n_accepted in [0, 8] * 10:
        policy.observe(_step(8, n_accepted, verify=0.27))
    assert policy.best_k() >= 7


def test_hybrid_policy_learns_each_drafters_k_apart():
    policy = adaptive_policy("hybrid", FREE_DRAFTS_CHEAP_VERIFY, PolicyConfig(k_max=8))
    model_policy, ngram_policy = policy.policies["model"], policy.policies["ngram"]
    assert ngram_policy.costs is model_policy.costs is policy.costs  # one machine, one verify curve
    assert policy.costs.draft_seconds("ngram") == 0.0 and policy.costs.draft_seconds("model") == 0.001
    for _ in range(30):  # the draft model is wrong at once ...
        policy.observe(_step(2, 0, verify=0.045, draft=0.001, confidences=[0.9, 0.9]))
    for _ in range(30):  # ... while n-gram drafts are right
        policy.observe(_step(4, 4, verify=0.05, draft=0.00001, source="ngram"))
    assert model_policy.acceptance.accepted.sum() == 0
    assert ngram_policy.acceptance.accepted[0] == ngram_policy.acceptance.drafted[0] > 10
    assert policy.choose("model") == 0 and policy.choose("ngram") >= 3
    assert policy.keep_drafting([0.99]) == model_policy.keep_drafting([0.99])


def test_tree_siblings_only_where_the_costs_say_they_pay_and_only_when_asked_for():
    gpu_like = MachineCosts((0.050, 0.051, 0.052, 0.053, 0.054), draft=0.004)  # extra verified tokens nearly free
    compute_bound = MachineCosts((0.035, 0.07, 0.105, 0.14, 0.175), draft=0.004)
    trees = PolicyConfig(trees=True)
    assert AdaptiveK(gpu_like, trees).branch([0.99, 0.5], runner_up=0.3)  # an unsure position, reached likely
    assert not AdaptiveK(compute_bound, trees).branch([0.99, 0.5], runner_up=0.3)
    assert not AdaptiveK(gpu_like, PolicyConfig()).branch([0.99, 0.5], runner_up=0.3)  # off by default
    # Siblings the verifier never takes stop being added.
    policy = AdaptiveK(gpu_like, trees)
    for _ in range(40):
        event = _step(3, 1, verify=0.052, draft=0.004, confidences=[0.99, 0.5, 0.9])
        event.n_siblings, event.sides = 1, [(0.3, False)]
        policy.observe(event)
    assert not policy.branch([0.99, 0.5], runner_up=0.3)


# Issue 32's compute-bound verifier (Qwen2.5 1.5B Q4_K_M, 2 threads, AVX-512): a verify of 5 costs 2.8x one.
ISSUE_Q4 = MachineCosts((0.0335, 0.052, 0.066, 0.079, 0.095, 0.117), draft=0.0205)


def _ngram_run(by_position, steps=400, seed=0, prior=0.84, config=None):
    """A hybrid's n-gram side on ISSUE_Q4 as the engine runs it: each step proposes up to the K it
    chose, each draft with its evidence's prior (a 5-token match of the prompt: 0.84), `worth` keeps
    n of them, and each draft position is accepted with the given chance (given the ones before were).
    The drafts it verified per step, and its tokens per second over plain decoding's."""
    rng = np.random.default_rng(seed)
    policy = adaptive_policy("hybrid", ISSUE_Q4, config or PolicyConfig(k_max=8))
    choices, tokens, seconds = [], 0, 0.0
    for _ in range(steps):
        confidences = [prior] * policy.choose("ngram")
        k = policy.worth(confidences) if confidences else 0
        chances = [by_position[min(i, len(by_position) - 1)] for i in range(k)]
        n_accepted = next((i for i, chance in enumerate(chances) if rng.random() >= chance), k)
        event = _step(
            k, n_accepted, verify=_verify(ISSUE_Q4, k), draft=0.0, confidences=confidences[:k], source="ngram"
        )
        policy.observe(event)
        choices.append(k)
        tokens, seconds = tokens + len(event.tokens), seconds + event.verify_seconds
    return choices, tokens / seconds * ISSUE_Q4.verify[0], policy.policies["ngram"]


def test_an_ngram_source_below_break_even_stops_drafting_once_its_class_has_settled():
    # Issue 32's edit prompt: n-gram drafts accepted at 0.55 / 0.33 / 0.33 by position, under the
    # ~55% a first draft needs here to pay for verifying one more token (1 row 33.5 ms, 2 rows 52).
    for seed in range(5):
        choices, speed, _ = _ngram_run([0.55, 0.33, 0.33], seed=seed)
        assert any(choices[:100])  # while its class is unsure (doubted), ...
        assert sum(map(bool, choices[100:])) <= 15  # ... then a probe now and then, as its ledger forgives
        assert speed > 0.975  # what learning it cost


def test_a_class_doubted_for_good_drafts_at_break_even_to_the_end():
    # `settle` 0: the first draft raised by `doubt` standard errors whatever the class has seen. The
    # decayed counts keep the standard error near 0.035, so the doubt lifts a 0.51-0.55 class over
    # break-even for good: 5 answers of 400 steps each drafted to the end in most, at 0.95-1.02x plain
    # (without the ledger, which ends the doubt of a source that has lost time: the next test).
    drafted_late = 0
    for seed in range(5):
        config = PolicyConfig(k_max=8, settle=0.0, ledger_floor=0.0)
        choices, _, _ = _ngram_run([0.55, 0.33, 0.33], seed=seed, config=config)
        drafted_late += any(choices[300:])
    assert drafted_late >= 3


def test_the_ledger_ends_the_doubt_of_a_class_doubted_for_good_once_its_drafts_lose_time():
    # The same class with doubt for good: every step of the last 300 drafted in four seeds of five
    # (0.96-1.01x plain). The ledger stops it once it has lost two plain steps, and lets it try again
    # once that loss has decayed (0.995 a step): 8-132 of the last 300 steps drafted, 0.98-1.00x plain.
    for seed in range(5):
        choices, speed, _ = _ngram_run([0.55, 0.33, 0.33], seed=seed, config=PolicyConfig(k_max=8, settle=0.0))
        assert sum(map(bool, choices[100:])) < 200 and speed > 0.98


def test_an_ngram_source_above_break_even_keeps_drafting():
    for seed in range(5):
        choices, speed, _ = _ngram_run([0.9, 0.85, 0.85], seed=seed)
        assert choices[100:].count(0) == 0 and speed > 1.3


def test_the_speedup_a_draft_would_buy_follows_what_its_drafts_and_the_costs_say():
    # What a draft model's long reading would buy (core/drafting.py): none on the compute-bound table,
    # much where the verifier is memory-bound and the drafts are right, little once they prove wrong.
    assert AdaptiveK(Q4, PolicyConfig(k_max=16)).speedup("model") < 1.0
    sure = AdaptiveK(F16, PolicyConfig(k_max=12))
    _run(sure, F16, [8] * 24)
    assert sure.speedup("model") > 2.0 and sure.speedup("ngram") is None
    poor = AdaptiveK(F16, PolicyConfig(k_max=12))
    _run(poor, F16, [0, 1, 0, 0] * 10)
    assert poor.speedup("model") < 1.15 < sure.speedup("model")
    hybrid = adaptive_policy("hybrid", F16, PolicyConfig(k_max=12))
    assert hybrid.speedup("model") == pytest.approx(hybrid.policies["model"].speedup("model"))


def test_a_long_read_is_priced_at_the_pairs_measured_acceptance_until_its_drafts_have_shown_what_they_do():
    # drafts/made.py measured the pair's acceptance on this machine: until `evidence` first drafts have
    # been seen, what a long read buys is priced at no less than that (else `worth_trying`, as could_win).
    generic = AdaptiveK(F16, PolicyConfig(k_max=12))
    sure = AdaptiveK(F16, PolicyConfig(k_max=12, measured_acceptance=0.85))
    rates = expected_at(0.85, 12) / sure.costs.step(np.arange(13), "model")
    assert sure.speedup("model") == pytest.approx(rates[1:].max() / rates[0])
    rates = expected_at(0.9, 12) / generic.costs.step(np.arange(13), "model")
    assert generic.speedup("model") == pytest.approx(rates[1:].max() / rates[0])
    assert generic.speedup("model") > sure.speedup("model")
    poor = AdaptiveK(F16, PolicyConfig(k_max=12, measured_acceptance=0.2))
    assert poor.speedup("model") == pytest.approx(rates_at(poor, 0.5))  # the generic prior's, not raised
    assert poor.speedup("model") < sure.speedup("model")
    # Three wrong first drafts do not put a long read below plain decoding (the draft would never read
    # again to show otherwise); once its drafts have had their say, they decide.
    _run(sure, F16, [0, 0, 0])
    assert sure.speedup("model") == pytest.approx(rates_at(sure, 0.85)) and rates_at(sure, 0.85) > 1.5
    for n_accepted in [0, 1, 0, 0] * 4:
        sure.observe(_step(4, n_accepted, verify=_verify(F16, 4), draft=F16.draft))
    assert sure.acceptance.first_tested >= sure.config.evidence and sure.speedup("model") < 1.15
    # It is the draft model's: prompt lookup's estimate is its own.
    ngram = AdaptiveK(F16, PolicyConfig(k_max=12, measured_acceptance=0.85), source="ngram")
    plain_ngram = AdaptiveK(F16, PolicyConfig(k_max=12), source="ngram")
    assert ngram.speedup("ngram") == pytest.approx(plain_ngram.speedup("ngram"))


def rates_at(policy: AdaptiveK, acceptance: float) -> float:
    rates = expected_at(acceptance, policy.config.k_max) / policy.costs.step(
        np.arange(policy.config.k_max + 1), "model"
    )
    return float(rates[1:].max() / rates[0])


def test_a_long_read_is_not_what_a_probe_catches_up_on():
    # The reading rule's purchase (drafting.Reading: more than LONG_READ tokens) is priced there; a probe
    # after plain steps reads only what they decoded. Counted, an agent prompt's 2.2 s read made the
    # median of two catch-ups 1.1 s, and the draft model, off after three wrong drafts, waited ~380
    # plain steps for its next probe.
    policy = AdaptiveK(F16, PolicyConfig(k_max=12))
    read = dataclasses.replace(_step(4, 1), draft_seconds=2.32, draft_catchup_seconds=2.2, draft_catchup_tokens=629)
    probe = dataclasses.replace(_step(4, 1), draft_seconds=0.16, draft_catchup_seconds=0.04, draft_catchup_tokens=6)
    policy.observe(read)
    policy.observe(probe)
    assert policy.costs.catchup_seconds.estimate(0.0) == pytest.approx(0.04)
    plain, one = policy.costs.step(np.array([0, 1]), "model")
    assert policy.probe_wait() == max(16, int(np.ceil((one - plain + 0.04) / (0.02 * plain)))) < 40


def test_a_draft_token_is_priced_at_a_pass_of_the_draft_model_not_at_what_read_ahead_saved():
    # 8 drafts in 2 passes of 0.03 s (6 read ahead with guesses): a draft token is priced 0.03 s, a pass,
    # not 0.0075 s: what prompt lookup's guesses save is not counted on (model_drafter's read-ahead).
    policy = AdaptiveK(F16, PolicyConfig(k_max=12))
    for _ in range(20):
        policy.observe(dataclasses.replace(_step(8, 8, draft=0.03 / 4), draft_read_ahead=6))
    assert policy.costs.draft_seconds("model") == pytest.approx(0.03, rel=0.05)
