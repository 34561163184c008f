"""Drafters (model with early stop, n-gram prompt lookup, hybrid) and the K policies."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel, one_hot_logits
from specgguf.drafting import HybridDrafter, ModelDrafter, NgramDrafter, build_drafter
from specgguf.engine import StepEvent, speculate
from specgguf.kpolicy import AdaptiveK, expected_tokens
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


def test_hybrid_uses_ngram_on_long_matches_and_the_model_otherwise():
    model = FakeModel(one_hot_logits(lambda c: 9, 20), n_vocab=20)
    hybrid = HybridDrafter(ModelDrafter(model), NgramDrafter(min_ngram=1), min_match=3)
    assert _propose(hybrid, [1, 2, 3, 4, 1, 2, 3], 2).source == "ngram"
    drafts = _propose(hybrid, [1, 2, 3, 4, 8, 2, 3], 2)  # only a 2-token match
    assert drafts.source == "draft" and drafts.tokens == [9, 9]


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
        verify = verify_costs[0] + (verify_costs[8] - verify_costs[0]) * k / 8
        accepted = min(n_accepted, k)
        policy.observe(StepEvent(accepted=[1] * accepted, rejected=[2] * (k - accepted), verifier_token=3,
                                 n_drafted=k, n_accepted=accepted, draft_seconds=DRAFT_SECONDS * k,
                                 verify_seconds=verify, sample_seconds=0.0,
                                 draft_source="draft" if k else None))
    return policy


def test_memory_bound_verifier_with_a_good_draft_speculates_deeply():
    policy = _policy_after(RECORDED["f16"], [8, 8, 7, 8, 8, 6, 8, 8] * 3)
    assert policy.choose() >= 6


def test_compute_bound_verifier_falls_back_to_plain():
    policy = _policy_after(RECORDED["q4_k_m"], [3, 2, 4, 1, 3, 2] * 4)
    assert policy.choose() == 0


def test_force_spec_never_chooses_plain():
    policy = _policy_after(RECORDED["q4_k_m"], [3, 2, 4, 1, 3, 2] * 4, k_min=1)
    assert policy.choose() >= 1


def test_plain_fallback_probes_again():
    policy = _policy_after(RECORDED["q4_k_m"], [1, 0, 1, 0] * 4)
    choices = [policy.choose() for _ in range(policy.probe_every + 1)]
    assert 0 in choices and max(choices) >= 2


@pytest.mark.parametrize("acceptance, k, expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 2, 1.75)])
def test_expected_tokens_per_step(acceptance, k, expected):
    assert expected_tokens(acceptance, k) == pytest.approx(expected)


def _step(k, n_accepted, *, verify=0.2, draft=0.04):
    return StepEvent(accepted=[1] * n_accepted, rejected=[2] * (k - n_accepted), verifier_token=3, n_drafted=k,
                     n_accepted=n_accepted, draft_seconds=draft * k, verify_seconds=verify, sample_seconds=0.0,
                     draft_source="draft" if k else None)


def test_per_position_acceptance_counts_only_positions_the_rule_tested():
    policy = AdaptiveK(k_max=4, decay=1.0)
    for n_accepted in (4, 4, 1, 0):
        policy.observe(_step(4, n_accepted))
    # Tested: all 4 positions twice, positions 1-2 once, position 1 once.
    np.testing.assert_array_equal(policy.drafted, [4, 3, 2, 2])
    np.testing.assert_array_equal(policy.accepted, [3, 2, 2, 2])
    prior = 10 / 13  # (9 accepted + 1) / (11 tested + 2)
    conditional = (np.array([3, 2, 2, 2]) + 2 * prior) / (np.array([4, 3, 2, 2]) + 2)
    np.testing.assert_allclose(policy.expected_by_k(), [1, *(1 + np.cumsum(np.cumprod(conditional)))])


def test_bursty_acceptance_is_modelled_per_position():
    # Either the first draft is wrong, or all eight are right: once position 1 is
    # accepted every later one is, so after a plain-step warm-up deep drafts pay off.
    policy = AdaptiveK(k_max=8, decay=1.0)
    policy.observe(_step(0, 0, verify=0.20))
    for n_accepted in [0, 8] * 10:
        policy.observe(_step(8, n_accepted, verify=0.34))
    prior = 81 / 92
    first, later = (10 + 2 * prior) / 22, (10 + 2 * prior) / 12
    assert policy.expected_by_k()[8] == pytest.approx(1 + first * sum(later ** i for i in range(8)))
    assert policy.best_k() == 8
