"""Prompt-lookup drafts with their evidence (core/ngram_drafter.py's Match) and the policy that verifies
only what its evidence says pays (AdaptiveK.worth): a sure copy of the prompt is drafted deep, a weak
repeat of the answer not at all, and what the evidence classes really deliver here is learned."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from fakes import FakeModel
from specgguf.core.acceptance_counts import Proposals, expected_tokens, tokens_spread
from specgguf.core.costs import MachineCosts
from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.engine import FixedK
from specgguf.core.kpolicy import PolicyConfig, adaptive_policy
from specgguf.core.ngram_drafter import ANSWER_PRIORS, DISAGREED, PROMPT_PRIORS, Match, NgramDrafter
from test_kpolicy import ISSUE_Q4, _step, _verify


def reference_lookup(context, k, *, max_ngram, min_ngram, window):
    """Prompt lookup as first written: the longest n first, each n a scan of the history."""
    history = np.asarray(context[-window:], dtype=np.int64)
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        hits = np.flatnonzero((sliding_window_view(history[:-1], n) == history[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return history[start : start + k].tolist(), n
    return [], 0


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(4, 2), (8, 2), (8, 1)])
def test_one_scan_finds_what_a_scan_per_length_finds(max_ngram, min_ngram):
    rng = np.random.default_rng(max_ngram + min_ngram)
    drafter = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram, window=40)
    for _ in range(3000):
        context = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 60))).tolist()
        match = drafter.lookup(context, 5)
        assert (match.tokens, match.length) == reference_lookup(
            context, 5, max_ngram=max_ngram, min_ngram=min_ngram, window=40
        )


def test_a_match_knows_where_its_continuation_is_and_whether_earlier_ones_agreed():
    drafter = NgramDrafter()
    prompt = [1, 2, 3, 4, 5, 6]
    drafter.prepare(prompt)
    copy = drafter.lookup(prompt + [9, 2, 3], 3)  # "2 3" continues in the prompt
    assert copy == Match([4, 5, 6], 2, in_prompt=True, agreed=True)
    # "2 3" went on with 4 in the prompt and with 7 in the answer: the latest is proposed, unsure.
    repeat = drafter.lookup(prompt + [2, 3, 7, 0, 2, 3], 2)
    assert repeat == Match([7, 0], 2, in_prompt=False, agreed=False)
    assert repeat.evidence() == [DISAGREED, ANSWER_PRIORS[3]]
    # Each later draft continues a longer match; a long copy of the prompt is the surest evidence.
    assert copy.evidence() == [PROMPT_PRIORS[2], PROMPT_PRIORS[3], PROMPT_PRIORS[4]]
    assert Match([1] * 3, 12, in_prompt=True).evidence() == [PROMPT_PRIORS[-1]] * 3
    assert list(PROMPT_PRIORS[2:]) == sorted(PROMPT_PRIORS[2:]) and list(ANSWER_PRIORS[2:]) == sorted(ANSWER_PRIORS[2:])
    assert all(p > a for p, a in zip(PROMPT_PRIORS[1:], ANSWER_PRIORS[1:]))


def test_a_fixed_k_verifies_every_draft_it_proposed():
    assert FixedK(4).worth([0.1, 0.1, 0.1]) == 3


def test_worth_takes_only_drafts_that_pay_for_their_rows_on_a_compute_bound_verifier():
    policy = adaptive_policy("hybrid", ISSUE_Q4, PolicyConfig(k_max=8))
    assert policy.worth(Match([1] * 8, 2).evidence()) == 0  # a weak repeat of the answer: a plain step
    assert policy.worth(Match([1] * 8, 2, agreed=False).evidence()) == 0
    assert policy.worth(Match([1] * 8, 12, in_prompt=True).evidence()) >= 3  # a long copy: deep (4 rows ~2.4x one)
    assert policy.worth([]) == 0


def test_the_spread_of_a_steps_tokens_is_that_of_its_distribution():
    rng = np.random.default_rng(0)
    for _ in range(50):
        chances = rng.uniform(0.0, 1.0, int(rng.integers(1, 9)))
        for n in range(len(chances) + 1):
            # P(exactly L of the first n drafts kept): the first L right, then one wrong (or L = n).
            reach = np.concatenate([[1.0], np.cumprod(chances[:n])])
            exactly = reach - np.concatenate([reach[1:], [0.0]])
            tokens = np.arange(n + 1) + 1
            mean = float(exactly @ tokens)
            assert expected_tokens(chances)[n] == pytest.approx(mean)
            assert tokens_spread(chances)[n] == pytest.approx(np.sqrt(exactly @ (tokens - mean) ** 2), abs=1e-9)


def test_a_risk_keeps_deep_proposals_whose_saving_is_within_their_luck_off():
    # 0.92-sure copies. On ISSUE_Q4 a deep proposal saves far beyond its spread; on a long context's
    # steeper curve (every row's logits; docs/benchmarks.md) seven drafts save 0.8 passes on average
    # with a spread of 2.8 tokens, and one draft does not pay for its row: a plain step.
    copy = Match([1] * 8, 12, in_prompt=True).evidence()
    steep = MachineCosts(tuple(ms / 1000 for ms in (27, 54, 72, 86, 104, 118, 131, 142, 157)), draft=0.0205)
    worth = {
        (name, risk): adaptive_policy("hybrid", costs, PolicyConfig(k_max=8, risk=risk)).worth(copy)
        for name, costs in (("q4", ISSUE_Q4), ("steep", steep))
        for risk in (0.0, 0.3, 0.6, 3.0)
    }
    assert worth["q4", 0.0] >= 3 and worth["q4", 0.3] == worth["q4", 0.0]
    assert worth["q4", 3.0] == 1  # one draft risks one row, and still pays for it here
    assert worth["steep", 0.0] >= 5 and worth["steep", 0.6] == 0 == worth["steep", 3.0]


def _evidence_run(classes, *, costs: MachineCosts = ISSUE_Q4, steps=600, seed=0, pooled=False):
    """The n-gram side of a hybrid fed steps whose proposals come with evidence: each step one of
    `classes` (a Match, and the true chance each of its drafts is right given the ones before, or
    (the first's, each later one's)). Returns its tokens per second over plain decoding's, and how
    many drafts each class had verified. `pooled`: later drafts priced by the bins all drafts share
    alone (what the policy did before it learned how far each kind of proposal goes)."""
    rng = np.random.default_rng(seed)
    # Pooled: each draft's own chance outweighs any count of its proposal's class.
    policy = adaptive_policy("hybrid", costs, PolicyConfig(k_max=8, proposal_weight=1e12 if pooled else 4.0))
    tokens, seconds, verified = 0, 0.0, [0] * len(classes)
    for _ in range(steps):
        which = int(rng.integers(len(classes)))
        match, truth = classes[which]
        k = policy.choose("ngram")
        evidence = match.evidence()[:k]
        n = policy.worth(evidence)
        first, rest = truth if isinstance(truth, tuple) else (truth, truth)
        n_accepted = next((i for i in range(n) if rng.random() >= (rest if i else first)), n)
        event = _step(n, n_accepted, verify=_verify(costs, n), draft=0.0, confidences=evidence[:n], source="ngram")
        policy.observe(event)
        tokens, seconds, verified[which] = (
            tokens + len(event.tokens),
            seconds + event.verify_seconds,
            verified[which] + n,
        )
    return tokens / seconds * costs.verify[0], verified


@pytest.mark.parametrize("seed", range(3))
def test_an_edit_drafts_its_copies_deep_and_its_weak_repeats_not_at_all(seed):
    sure = (Match([1] * 8, 10, in_prompt=True), 0.92)
    weak = (Match([1] * 8, 2), 0.35)
    speed, verified = _evidence_run([sure, weak], seed=seed)
    # Knowing the truth: 3 drafts at each sure step (3.5 tokens in 79 ms), none at a weak one: 1.34x.
    assert speed > 1.25 and verified[1] < 0.02 * verified[0]


@pytest.mark.parametrize("seed", range(3))
def test_prose_whose_matches_are_all_weak_runs_at_plain_speed(seed):
    speed, _ = _evidence_run([(Match([1] * 8, 2), 0.3), (Match([1] * 8, 3), 0.4)], seed=seed)
    assert speed > 0.99


@pytest.mark.parametrize("seed", range(3))
def test_evidence_that_lies_here_is_learned_and_stops_costing(seed):
    # Long copies of the prompt that are right only one time in five (a prompt the answer does not
    # follow): the prior says draft deep, what the steps teach says not.
    speed, verified = _evidence_run([(Match([1] * 8, 10, in_prompt=True), 0.2)], seed=seed)
    assert speed > 0.95 and verified[0] < 150


@pytest.mark.parametrize("seed", range(3))
def test_a_proposal_that_starts_on_a_short_match_is_priced_by_how_far_such_proposals_go(seed):
    # A chat's history: long copies that run on (right 19 times in 20 at every draft), and copies
    # that start on a 3-token match, right 4 times in 5 at first and then parting from the history
    # (half the time at each later draft). Their later drafts' evidence (matches of 4 and more
    # tokens) is what the long copies' bins learn: priced by those, they are drafted deep and lose.
    long, short = (Match([1] * 8, 10, in_prompt=True), 0.95), (Match([1] * 8, 3, in_prompt=True), (0.8, 0.5))
    speed, verified = _evidence_run([long, short], seed=seed)
    pooled_speed, pooled_verified = _evidence_run([long, short], seed=seed, pooled=True)
    # Knowing the truth, one draft of a short-match copy pays (1.16x plain on these costs), two 1.12x,
    # three 1.02x; priced by the long copies' bins it is drafted deeper. (Once a bin has settled, its
    # first draft is no longer doubted upwards, which also keeps the pooled pricing from some of its
    # deepest drafts: 0.57-0.68x as many verified with doubt for good, 0.71-0.78x with `settle`.)
    assert verified[1] < 0.8 * pooled_verified[1]
    assert speed > pooled_speed


def test_a_class_whose_first_draft_failed_once_is_still_tried_but_not_drafted_deep():
    proposals = Proposals(decay=0.995, k_max=4, weight=4.0)
    own = np.array([0.7, 0.9, 0.9, 0.9])
    proposals.observe(0.7, 4, 0)  # its first proposal: the first draft wrong
    assert proposals.chances(0.7, own)[0] < 0.6  # its estimate falls ...
    assert proposals.chances(0.7, own, optimism=2.0)[0] == 0.7  # ... but one failure is within the doubt
    for _ in range(30):  # many failures are not
        proposals.observe(0.7, 4, 0)
    assert proposals.chances(0.7, own, optimism=2.0)[0] < 0.2
    for _ in range(30):  # proposals right at first and then parting: the later drafts fall, unraised
        proposals.observe(0.7, 4, 1)
    later = proposals.chances(0.7, own, optimism=2.0)[1:]
    assert later[0] < 0.2 and list(later[1:]) == [0.9, 0.9]  # (positions 3 and 4 never tested)


def test_the_default_hybrid_leaves_weak_repeats_to_the_draft_model():
    hybrid = build_drafter("hybrid", FakeModel(lambda context: np.zeros(20), n_vocab=20), DraftSettings())
    prompt = [1, 2, 3, 4, 5, 6]
    hybrid.prepare(prompt)
    assert hybrid.next_source(prompt + [9, 2, 3]) == "ngram"  # a copy of the prompt, 2 tokens matched
    assert hybrid.next_source(prompt + [7, 8, 0, 7, 8]) == "model"  # a 2-token repeat of the answer
    assert hybrid.next_source(prompt + [7, 8, 0, 9, 7, 8, 0, 9, 7, 8, 0]) == "ngram"  # a long one
    assert hybrid.next_source(prompt + [2, 3, 7, 0, 2, 3]) == "model"  # earlier occurrences disagreed


def _first_drafts_refused(config, evidence, steps=6):
    """The n-gram side of a hybrid on ISSUE_Q4 offered the same proposal `steps` times, each refused at
    its first draft: how many drafts it verified each time, and the side."""
    policy = adaptive_policy("hybrid", ISSUE_Q4, config)
    verified = []
    for _ in range(steps):
        k = policy.worth(evidence)
        verified.append(k)
        event = _step(k, 0, verify=_verify(ISSUE_Q4, k), draft=0.0, confidences=evidence[:k], source="ngram")
        policy.observe(event if k else _step(0, 0, verify=ISSUE_Q4.verify[0]))
    return verified, policy.policies["ngram"]


def test_a_source_whose_drafts_lost_time_is_priced_without_the_benefit_of_the_doubt():
    # A copy from the prompt (match of 3) whose first drafts are all wrong, as in a question about two
    # modules the prompt quotes: the doubt kept a class of few drafts drafting 3 deep five times in six.
    # Once the drafts have cost more than two plain steps, what they showed decides: a plain step.
    evidence = Match([1] * 8, 3, in_prompt=True).evidence()
    doubted, side = _first_drafts_refused(PolicyConfig(k_max=8, ledger_floor=0.0), evidence)
    assert doubted[:4] == [3, 3, 3, 3] and not side.losing()
    guarded, side = _first_drafts_refused(PolicyConfig(k_max=8), evidence)
    assert guarded[:2] == doubted[:2] and guarded[2:] == [0] * 4
    plain = side.plain_seconds()
    assert side.losing() and side.saved < -2 * plain


def test_the_ledger_counts_each_drafted_steps_tokens_at_plain_decodings_price_less_its_seconds():
    policy = adaptive_policy("hybrid", ISSUE_Q4, PolicyConfig(k_max=8))
    side = policy.policies["ngram"]
    policy.observe(_step(0, 0, verify=ISSUE_Q4.verify[0]))  # a plain step: nothing drafted, nothing counted
    assert side.saved == 0.0
    evidence = Match([1] * 8, 12, in_prompt=True).evidence()
    policy.observe(_step(4, 4, verify=_verify(ISSUE_Q4, 4), draft=0.0, confidences=evidence[:4], source="ngram"))
    plain = side.plain_seconds()
    assert side.saved == pytest.approx(5 * plain - _verify(ISSUE_Q4, 4))  # 5 tokens for one 5-row pass
    assert side.saved > 0 and not side.losing()
    policy.observe(_step(3, 1, verify=_verify(ISSUE_Q4, 3), draft=0.0, confidences=evidence[:3], source="model"))
    assert side.saved == pytest.approx(5 * plain - _verify(ISSUE_Q4, 4))  # another source's step is its own
