"""What the steps teach a K policy about its drafts: acceptance per draft position, and how often
a draft of some confidence (a draft model's top probability, or an n-gram match's evidence) is right.
`PolicyConfig` holds every knob of the adaptive policy (kpolicy.py) that uses them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rounds import K_MAX

# Bins of the draft's top probability for calibration: finer near 1, where most drafts are.
CONFIDENCE_EDGES = np.array([0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995])


@dataclass(frozen=True)
class PolicyConfig:
    k_max: int = K_MAX
    k_min: int = 0  # 1 forces speculation (no fallback to plain)
    decay: float = 0.95  # weight of the past per step
    prior_acceptance: float = 0.5  # c_i before any evidence ...
    prior_drafts: float = 4.0  # ... worth this many drafts
    doubt: float = 2.0  # standard errors of optimism about c_1 before falling back to plain
    evidence: int = 16  # first drafts tested (not decayed) after which `doubt` no longer keeps a source drafting
    probe_every: int = 16  # plain steps before the first probe; doubles after each lost probe ...
    max_probe_interval: int = 128  # ... up to this
    probe_budget: float = 0.02  # ... and never more often than losing this share of plain decoding's time
    explore_every: int = 8
    explore_budget: float = 0.1  # explore deeper only where the estimate says it loses at most this share
    calibration_decay: float = 0.995  # slower: each confidence bin sees only some of the drafts
    proposal_weight: float = 4.0  # a whole proposal's drafts' own chances count as this many of its class's
    cost_trust: int = 3  # the prior (tuning.json's costs) counts as this many measured steps
    recheck_every: int = 16  # steps between asking again whether drafting could win at the learned costs
    # `worth`: verify n > 1 of a proposal's drafts only where the seconds they save on average clear this
    # many standard deviations of what they save. 0: off (a measured candidate for a per-request floor,
    # docs/benchmarks.md; `--config risk=0.3` in the replays, `--b-config` in trace_ab.py).
    risk: float = 0.0
    # `worth`: a whole proposal's first draft is raised by `doubt` standard errors only while its bin has
    # seen fewer than this many drafts (decayed counts: a bin that stops drafting is doubted again once
    # other bins' drafts have decayed its count below this); 0: always. With doubt for good, a class at
    # break-even drafted to the end of a session (docs/adaptive-k.md, "A settled class").
    settle: float = 32.0
    # `worth`: once a source's drafted steps have lost more than this many plain steps' seconds in all
    # (what they made, at plain decoding's price, less what they took; `AdaptiveK.saved`), its proposals
    # are priced by what they showed, without `doubt`, until they win it back. 0: off.
    ledger_floor: float = 2.0
    ledger_decay: float = 0.995  # ... the weight of its past per step, plain ones too: no loss is held for good
    worth_trying: float = 0.9  # draft at all only if some K wins at this acceptance per position
    # Draft trees (--draft-tree): add the draft's runner-up beside the chain where it pays
    # (`AdaptiveK.branch`). Off by default: on the CPUs measured it did not win beyond the noise
    # (docs/adaptive-k.md); it is for verifiers that check extra tokens nearly free (GPUs).
    trees: bool = False
    # The draft model's acceptance per position, measured greedy on this machine against this verifier
    # (drafts/made.py's calibration), where known: the least a long read is priced to buy before the
    # draft's first `evidence` drafts have shown what it does (`AdaptiveK.speedup`; drafting.Reading).
    measured_acceptance: float | None = None


def expected_tokens(chances: np.ndarray) -> np.ndarray:
    """E_n for n = 0..len(chances), draft i right with chances[i] given the ones before it were: the
    tokens a step verifying the first n drafts emits on average, 1 + c_1 + c_1·c_2 + … + c_1·…·c_n."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(chances))])


def tokens_spread(chances: np.ndarray) -> np.ndarray:
    """The standard deviation of a step's tokens for n = 0..len(chances) drafts, chances as in
    `expected_tokens`: L drafts kept, P(L ≥ j) = c_1·…·c_j, so E[L] = Σ_j P(L ≥ j) and
    E[L²] = Σ_j (2j − 1)·P(L ≥ j)."""
    reach = np.concatenate([[0.0], np.cumprod(chances)])
    j = np.arange(len(reach))
    mean, square = np.cumsum(reach), np.cumsum((2 * j - 1) * reach)
    return np.sqrt(np.maximum(0.0, square - mean**2))


def confidence_bin(probability: float) -> int:
    """The calibration bin of a draft's probability (CONFIDENCE_EDGES)."""
    return int(np.searchsorted(CONFIDENCE_EDGES, probability, side="right"))


def doubted(chance: float, prior: float, seen: float, optimism: float, settled: float = 0.0) -> float:
    """`chance` (learned from `seen` drafts), but no lower than `prior` while that is within `optimism`
    standard errors of it: a few unlucky drafts do not end drafting for good, and nothing is thought
    better than its prior before it has shown it. With `settled`, `chance` itself once `seen` reaches it."""
    if settled and seen >= settled:
        return chance
    return max(chance, min(prior, chance + optimism * float(np.sqrt(chance * (1.0 - chance) / seen))))


class Calibration:
    """How often a draft of some probability turns out right: decayed counts per probability bin,
    the probability itself a prior worth two drafts."""

    def __init__(self, decay: float):
        self.decay = decay
        self.tried = np.zeros(len(CONFIDENCE_EDGES) + 1)
        self.right = np.zeros(len(CONFIDENCE_EDGES) + 1)

    def __call__(self, probability: float, optimism: float = 0.0, settled: float = 0.0) -> float:
        """The chance; with `optimism`, no lower than the probability itself while that is within so many
        standard errors of the bin's estimate: a few unlucky drafts do not end a bin's drafts for good,
        and a bin is never thought better than its own probability says before it has shown it. With
        `settled`, the optimism ends once the bin has seen that many drafts (decayed)."""
        b = confidence_bin(probability)
        seen = self.tried[b] + 2.0
        chance = (self.right[b] + 2.0 * probability) / seen
        return doubted(chance, probability, seen, optimism, settled) if optimism else chance

    def observe(self, probabilities: list[float], right: list[bool]) -> None:
        self.tried *= self.decay
        self.right *= self.decay
        bins = np.searchsorted(CONFIDENCE_EDGES, probabilities, side="right")
        np.add.at(self.tried, bins, 1.0)
        np.add.at(self.right, bins[np.asarray(right, dtype=bool)], 1.0)


class Proposals:
    """How far a whole proposal (prompt lookup's: drafts proposed together, each with its evidence) is
    right, by its first draft's evidence: decayed counts per draft position for each bin of the first
    draft's prior chance. A proposal that starts on weak evidence goes on right less often than its
    later drafts' own evidence says (its match was short; a long match's drafts come right in runs), so
    its later drafts are not priced by the bins all drafts share alone (docs/adaptive-k.md measured both)."""

    def __init__(self, decay: float, k_max: int, weight: float):
        self.decay, self.weight = decay, weight
        self.drafted = np.zeros((len(CONFIDENCE_EDGES) + 1, k_max))
        self.accepted = np.zeros((len(CONFIDENCE_EDGES) + 1, k_max))

    def chances(self, first: float, prior: np.ndarray, optimism: float = 0.0, settled: float = 0.0) -> np.ndarray:
        """Each draft's chance given the ones before it were, for a proposal whose first draft has prior
        chance `first`: its class's counts at that position, with `prior` (the drafts' own calibrated
        chances) worth `weight` proposals of the class. With `optimism`, the first draft's is no lower
        than its prior while that is within so many standard errors of the class's estimate (as
        Calibration): a few unlucky first drafts do not end a class's drafts, which no draft would then
        teach again. The later drafts' are not raised: how deep to draft is what the class is for. With
        `settled`, nor is the first once its class has seen that many proposals (decayed)."""
        b, n = confidence_bin(first), len(prior)
        seen = self.drafted[b, :n] + self.weight
        chance = (self.accepted[b, :n] + self.weight * prior) / seen
        if optimism and n:
            chance[0] = doubted(chance[0], prior[0], seen[0], optimism, settled)
        return chance

    def observe(self, first: float, n_drafted: int, n_accepted: int) -> None:
        b = confidence_bin(first)
        self.drafted *= self.decay
        self.accepted *= self.decay
        self.drafted[b, : min(n_accepted + 1, n_drafted)] += 1  # position i is tested if 1..i-1 were accepted
        self.accepted[b, : min(n_accepted, n_drafted)] += 1


class Acceptance:
    """Per-position acceptance c_i, and the draft's confidence calibrated against the verifier."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.drafted = np.zeros(config.k_max)  # decayed count of drafts tested at each position
        self.accepted = np.zeros(config.k_max)  # ... and of those accepted
        self.first_tested = 0  # steps that tested a first draft, not decayed: how much evidence there is
        # Chance the verifier accepts a draft of this top probability (earlier drafts accepted).
        self.calibrated = Calibration(config.calibration_decay)
        # ... and how far a whole proposal goes, by its first draft's evidence.
        self.proposals = Proposals(config.calibration_decay, config.k_max, config.proposal_weight)

    def overall(self) -> float:
        weight = self.config.prior_drafts
        return (self.accepted.sum() + weight * self.config.prior_acceptance) / (self.drafted.sum() + weight)

    def expected(self, optimism: float = 0.0) -> np.ndarray:
        """E(k) for k = 0..k_max. Each c_i is shrunk towards c_(i-1) (c_1 towards the overall
        rate) with the weight of two drafts: drafts come right in runs, so a deep position seen
        once failing does not condemn deep drafts. `optimism` raises c_1 by that many standard
        errors (an upper confidence bound): c_1 is what every speculative step tests."""
        conditional = np.empty(self.config.k_max)
        prior = self.overall()
        for i in range(self.config.k_max):
            prior = conditional[i] = (self.accepted[i] + 2.0 * prior) / (self.drafted[i] + 2.0)
        if optimism:
            first, seen = conditional[0], self.drafted[0] + self.config.prior_drafts
            conditional[0] = min(1.0, first + optimism * np.sqrt(first * (1.0 - first) / seen))
        return expected_tokens(conditional)

    def observe(self, n_drafted: int, n_accepted: int, confidences: list[float]) -> None:
        decay, n = self.config.decay, min(n_drafted, self.config.k_max)
        self.drafted *= decay
        self.accepted *= decay
        self.drafted[: min(n_accepted + 1, n)] += 1  # position i is tested only if 1..i-1 were accepted
        self.accepted[: min(n_accepted, n)] += 1
        self.first_tested += n > 0
        if confidences:
            tested = confidences[: n_accepted + 1]
            self.calibrated.observe(tested, [i < n_accepted for i in range(len(tested))])
            self.proposals.observe(confidences[0], n, n_accepted)
