"""How many tokens to draft next: K chosen before each step from measured costs.

The policy maximises expected tokens per second (docs/adaptive-k.md derives it
and holds the ablation that decided what stays):

- Acceptance. Draft position i (1-based) is accepted, given that positions
  1..i-1 were, with probability c_i, from decayed counts per position. A step
  with k drafts emits E(k) = 1 + c_1 + c_1·c_2 + … + c_1·…·c_k tokens on average
  (the accepted drafts plus the verifier's own token). With every c_i equal this
  is Leviathan et al.'s (1 − a^(k+1)) / (1 − a).
- Cost. A step costs T(k) = k·t_draft + t_verify(k + 1) + overhead, each learned from
  the steps run (costs.py's StepCosts: recent medians), the verifier's batch cost table
  measured once per machine before the first answer only their prior. A hybrid's
  sources share one cost curve; what a run learned goes back to tuning.json.
- Decision. K* = argmax E(k) / T(k) over k_min ≤ k ≤ k_max; k = 0 is plain
  decoding. Because the costs are known before generation starts, a pair that
  cannot win here even with every draft accepted does not draft at all (asked again
  every `recheck_every` steps at the learned costs), and one that can starts
  drafting at once: no warm-up step is lost.
  Each source decides on its own acceptance against its break-even at the learned
  costs. When plain looks best the policy still drafts while c_1 raised by `doubt`
  standard errors would win (for the source's first `evidence` drafts only), and
  after giving up it probes with one draft after `probe_every` plain steps,
  doubling the wait after each probe that does not win speculation back, and never
  so often that lost probes cost over `probe_budget` of plain decoding's time.
- Draft length. A draft model reports its top probability per token, so K* ≥ 1
  only says "speculate": `keep_drafting` stops the draft when one more token no
  longer raises the step's expected tokens per second, with the draft's
  confidence calibrated online against what the verifier accepted. Proposers
  without a confidence (prompt lookup) draft K* tokens, and every `explore_every`
  steps up to K* + 2 where that loses under `explore_budget`, to keep estimates for
  deeper positions.
- Trees. After each draft token the draft model also reports its runner-up's
  probability; `branch` adds the runner-up as a sibling leaf (checked in the same
  verifier pass) where the chance it is taken, times what a token is worth in the
  seconds steps are taking per token, beats what one more token adds to the
  verify batch. Where verifying is compute-bound that is almost never; where it
  is memory-bound, at the chain's unsure positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .acceptance_counts import Acceptance, Calibration, PolicyConfig, expected_tokens, tokens_spread
from .costs import MachineCosts, StepCosts
from .drafters import DRAFTER_KINDS, FORCED, DrafterKind
from .drafting import CONFIDENT, WHOLE_DRAFTS, Source
from .engine import KPolicy, StepEvent
from .rounds import ALONE, K_MAX, Round, expected_at, optimistic, reprice


class AdaptiveK:
    """Decides K for one drafter ("model": a draft model, or "ngram"); learns its acceptance only from its own
    steps (the costs from every step)."""

    def __init__(
        self,
        costs: MachineCosts,
        config: PolicyConfig = PolicyConfig(),
        *,
        source: Source = "model",
        shared: StepCosts | None = None,
    ):
        self.config, self.source = config, source
        # The costs are the machine's, whichever source drafted: a hybrid's sides share one `shared`
        # (PerSource observes it); a policy alone learns its own.
        self.owns_costs = shared is None
        self.costs = StepCosts(costs, trust=config.cost_trust) if shared is None else shared
        self.acceptance = Acceptance(config)
        # Siblings (the draft's runner-up beside the chain): how often the verifier takes one,
        # given its parent was kept; and what a token is worth, in the seconds steps take per token.
        self.sides = Calibration(config.calibration_decay)
        self.seconds_per_token = float(self.costs.verify(np.array([0]))[0])  # plain decoding's, at first
        # The drafter reports confidence: `keep_drafting` (or `worth`) sets the length. A draft model's
        # does from its first step (CONFIDENT: its first draft was 1 token, at a K from the prior, where
        # the next were 6-16 on the F16 verifier); prompt lookup's evidence is seen in its first proposal.
        self.confidence_seen = source in CONFIDENT
        self.steps, self.plain_steps, self.probe_interval = 0, 0, config.probe_every
        # What its drafted steps delivered: each one's tokens at plain decoding's price less its own
        # seconds, summed, decayed each step. Negative: drafting here has cost time (`losing`).
        self.saved = 0.0
        self.round = ALONE  # the passes its steps are priced in (`share`)
        # Decided from the costs before generation, then every `recheck_every` steps at the learned costs.
        self.worth_drafting = config.k_min > 0 or self.could_win()

    adapts = True

    def share(self, round: Round) -> None:
        """Price steps as one of the round's requests stepping in the same passes (rounds.reprice)."""
        before, self.round = self.round, round
        if self.owns_costs and reprice(self.costs, before, round, self.config.k_max):
            self.worth_drafting = self.config.k_min > 0 or self.could_win()

    def drafts(self, source: Source = "model") -> bool:
        return self.worth_drafting

    def expected(self, source: Source) -> np.ndarray | None:
        """E(k) of its drafts (None: `source` is another's); over its first `evidence` drafts optimistic,
        as best_k and could_win are (rounds.optimistic), or a round of lanes would never draft to learn."""
        if source != self.source:
            return None
        learned = self.acceptance.expected()
        if self.acceptance.first_tested >= self.config.evidence:
            return learned
        return optimistic(learned, self.acceptance.expected(self.config.doubt), self.config.worth_trying)

    def speedup(self, source: Source) -> float | None:
        """max_k E(k) / T(k) ÷ E(0) / T(0), E as `expected` prices it (optimistic over the first drafts),
        but for a draft model (what its long read buys: drafting.Reading), until `evidence` first drafts
        have shown what it does here, what they show (not raised) or the acceptance measured for the
        pair on this machine (`PolicyConfig.measured_acceptance`), else `worth_trying`, as `could_win`
        prices drafting at all, whichever is more. Priced at its first drafts alone, three wrong ones in
        an agent's first answer put it under plain decoding, and the draft never read again for the
        512-token answer after (docs/benchmarks.md, "The reading's rent"); and the generic prior (0.5)
        priced the F16 verifier's drafting at 1.06-1.43× plain where the pair's measured 0.85 says 1.59×."""
        if source != self.source:
            return None
        if self.source == "model" and self.acceptance.first_tested < self.config.evidence:
            hoped = self.config.measured_acceptance
            hoped = self.config.worth_trying if hoped is None else hoped
            expected = np.maximum(self.acceptance.expected(), expected_at(hoped, self.config.k_max))
        else:
            expected = self.expected(source)
        rates = expected / self.costs.step(np.arange(len(expected)), self.source)
        return float(rates[1:].max() / rates[0])

    def read_seconds(self, source: Source) -> float | None:
        return self.costs.read_seconds(source) if source == self.source else None

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        return elapsed, event.draft_catchup_seconds

    def rates(self, optimism: float = 0.0) -> np.ndarray:
        """Expected tokens per second E(k) / T(k) for k = 0..k_max."""
        return self.acceptance.expected(optimism) / self.costs.step(np.arange(self.config.k_max + 1), self.source)

    def could_win(self) -> bool:
        """Would some K beat plain decoding if drafts were right as often as `worth_trying` says
        (9 in 10: better than most pairs manage)? If not, never draft: a probe costs too (the
        draft model first reads every token decoded without it)."""
        ks = np.arange(self.config.k_max + 1)
        ceiling = expected_at(self.config.worth_trying, self.config.k_max) / self.costs.step(ks, self.source)
        return bool(ceiling[1:].max() > ceiling[0])

    def best_k(self) -> int:
        k_min, rates = self.config.k_min, self.rates()
        k = k_min + int(np.argmax(rates[k_min:]))
        undecided = self.acceptance.first_tested < self.config.evidence
        if k == 0 and undecided and self.rates(optimism=self.config.doubt)[1:].max() > rates[0]:
            k = 1 + int(np.argmax(rates[1:]))  # too few drafts seen to give up on speculation yet
        return k

    def probe_wait(self) -> int:
        """Plain steps before a source that is off drafts once more: `probe_interval` (doubled after
        each lost probe), and never so often that lost probes cost more than `probe_budget` of plain
        decoding's time. A probe loses at most one draft's cost and verifying one more token, and for
        the draft model its catching up on the tokens decoded without it."""
        plain, one = self.costs.step(np.array([0, 1]), self.source)
        lost = one - plain + (self.costs.catchup_seconds.estimate(0.0) if self.source == "model" else 0.0)
        return max(self.probe_interval, int(np.ceil(lost / (self.config.probe_budget * plain))))

    def explore_k(self, k: int) -> int:
        """K for an exploring step (deeper positions' estimates need drafts there): k + 2, or less
        where the estimate says going deeper loses more than `explore_budget` of the step's rate."""
        rates = self.rates()
        deeper = [
            j
            for j in range(k + 1, min(k + 2, self.config.k_max) + 1)
            if rates[j] >= (1 - self.config.explore_budget) * rates[k]
        ]
        return max(deeper, default=k)

    def choose(self, source: Source = "model") -> int:
        if source == FORCED:
            return self.forced_k()
        self.steps += 1
        if self.steps % self.config.recheck_every == 0:
            self.worth_drafting = self.config.k_min > 0 or self.could_win()
        if not self.worth_drafting:
            return 0
        if self.confidence_seen and self.source in WHOLE_DRAFTS:
            return self.config.k_max  # free drafts, each with its evidence: `worth` decides step by step
        k = self.best_k()
        if k == 0:
            self.plain_steps += 1
            if self.plain_steps < self.probe_wait():
                return 0
            # Probe with one draft in case the text became easier to draft; each probe that does
            # not win speculation back doubles the wait (the draft first reads what it missed).
            self.plain_steps, self.probe_interval = 0, min(2 * self.probe_interval, self.config.max_probe_interval)
            return 1
        self.plain_steps, self.probe_interval = 0, self.config.probe_every
        if self.steps % self.config.recheck_every == 0 and not self.costs.measured(0) and self.config.k_min == 0:
            return 0  # plain decoding's own cost, what every draft must beat, measured a few times
        if self.confidence_seen:
            return self.config.k_max  # a cap: `keep_drafting` (or `worth`) ends the draft
        if self.steps % self.config.explore_every == 0:
            return self.explore_k(k)
        return k

    def forced_k(self) -> int:
        """K for a grammar's forced tokens: they cost no drafting and are (nearly) always accepted, so
        the K that makes the most tokens per second of verifying, (k + 1) / T_verify(k) (the drafter
        proposes no more than the grammar forces)."""
        ks = np.arange(self.config.k_max + 1)
        return int(np.argmax((ks + 1) / (self.costs.verify(ks) + self.costs.overhead)))

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Draft one more token? Asked after each draft with the draft's top probabilities so far.

        With i drafts of confidence c_1..c_i, P_j = a(c_1)·…·a(c_j) is the chance the
        first j are all accepted (a = calibrated acceptance), the step yields
        E_i = 1 + P_1 + … + P_i tokens on average for T_i = T(i) seconds. Drafting on
        to j > i drafts, each as sure as the last (confidence runs in streaks), yields
        E_j = E_i + P_i·(a + a² + … + a^(j−i)) with a = a(c_i). Go on iff some j ≤ k_max
        beats E_i / T_i: the measured verify table is irregular (one more token can cost far
        more at one batch size than at the next), so looking past the next draft matters.
        """
        n = len(confidences)
        if n >= self.config.k_max:
            return False
        acceptance = np.array([self.acceptance.calibrated(c) for c in confidences])
        all_accepted = np.cumprod(acceptance)
        lengths = np.arange(n, self.config.k_max + 1)
        streak = all_accepted[-1] * np.cumsum(self.ahead(acceptance) ** np.arange(1, len(lengths)))
        expected = 1.0 + all_accepted.sum() + np.concatenate([[0.0], streak])
        rates = expected / self.costs.step(lengths, self.source)
        return bool(rates[1:].max() > rates[0])

    def worth(self, confidences: list[float]) -> int:
        """How many of a whole proposal's drafts to verify: with a_j the chance of draft j given drafts
        1..j-1 were right, learned per position for proposals whose first draft had evidence like this
        one's (acceptance_counts.Proposals), from its own calibrated chance before (its evidence's prior,
        learned per evidence bin, raised by `doubt` standard errors while a bin has seen fewer than
        `settle` drafts and this source's drafts have not lost time: `losing`),
        verifying the first n yields E_n = 1 + a_1 + a_1·a_2 + … + a_1·…·a_n
        tokens in T(n) seconds; n* = argmax E_n / T(n), 0 (a plain step) where no draft is sure
        enough to pay for the rows it adds. With `risk` ρ: a step saves S_n = E_n·T(0) − T(n) seconds
        against plain passes on average, with spread σ_n·T(0) (tokens_spread); n > 1 drafts are a
        choice only where S_n ≥ ρ·σ_n·T(0) (one draft risks one row, and is how a class is learned)."""
        n = min(len(confidences), self.config.k_max)
        if n == 0 or self.config.k_min > 0:
            return n
        doubt, settle = (0.0, 0.0) if self.losing() else (self.config.doubt, self.config.settle)
        own = np.array([self.acceptance.calibrated(c, doubt, settle) for c in confidences[:n]])
        acceptance = self.acceptance.proposals.chances(confidences[0], own, doubt, settle)
        expected, costs = expected_tokens(acceptance), self.costs.step(np.arange(n + 1), self.source)
        rates = expected / costs
        if self.config.risk:  # (at ρ 0 the test is moot: an n with S_n < 0 has E_n / T(n) < 1 / T(0))
            spread = tokens_spread(acceptance)
            spread[:2] = 0.0  # a plain step, and one draft
            sure = expected * costs[0] - costs >= self.config.risk * spread * costs[0]
            rates = np.where(sure, rates, -np.inf)
        return int(np.argmax(rates))

    def losing(self) -> bool:
        """Have this source's drafted steps lost more than `ledger_floor` plain steps' seconds in all? Then
        the benefit of the doubt a class gets while it has seen few drafts has already been paid for: an
        answer of 128 tokens may see fewer proposals than any class needs to settle (a question about two
        modules quoted in the prompt: 17 proposals from long matches, a third of first drafts right). The
        ledger decays each step (`ledger_decay`), so the doubt comes back once the loss is old."""
        floor = self.config.ledger_floor
        return bool(floor) and self.saved < -floor * self.plain_seconds()

    def plain_seconds(self) -> float:
        """T(0): the seconds a plain step takes, as the costs have learned it."""
        return float(self.costs.step(np.array([0]), self.source)[0])

    def ahead(self, acceptance: np.ndarray) -> float:
        """The chance each draft past the newest is accepted, given the calibrated acceptance of
        the drafts so far: the newest's (confidence runs in streaks; the ablation in
        docs/adaptive-k.md tried the overall rate instead)."""
        return float(acceptance[-1])

    @property
    def branches(self) -> bool:
        return self.config.trees

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        """Add the draft's runner-up as a sibling of the newest draft (a leaf the verifier checks
        in the same pass)? With i drafts so far, the sibling is reached if drafts 1..i-1 are all
        accepted, P = a(c_1)·…·a(c_(i-1)), and then taken with probability h(runner-up) (its
        calibrated hit rate), adding one token to the step. Worth it iff

            P · h · (seconds per token the steps are making) > (seconds one more token adds to the verify batch)
        """
        if not self.config.trees:
            return False
        reach = float(np.prod([self.acceptance.calibrated(c) for c in confidences[:-1]]))
        return reach * self.sides(runner_up) * self.seconds_per_token > self.costs.per_extra_token()

    def learned_costs(self) -> MachineCosts | None:
        """What the steps taught about this machine's costs, once enough steps ran (StepCosts.learned);
        None while priced for shared passes (a share of them is not what a request alone costs)."""
        return None if self.round.lanes > 1 else self.costs.learned()

    def observe(self, event: StepEvent) -> None:
        if self.owns_costs:
            self.costs.observe(event)
        if event.n_drafted and event.draft_source != self.source:
            return  # another drafter's step (an n-gram proposal in a hybrid): not this one's acceptance
        if not event.tokens and event.n_drafted == 0:
            return
        if event.tokens:
            seconds = event.draft_seconds + event.verify_seconds + event.sample_seconds
            self.seconds_per_token = 0.9 * self.seconds_per_token + 0.1 * seconds / len(event.tokens)
        if event.sides:
            self.sides.observe([runner_up for runner_up, _ in event.sides], [taken for _, taken in event.sides])
        self.saved *= self.config.ledger_decay  # every step, plain ones too: a loss is forgiven in time
        if event.n_drafted:
            self.acceptance.observe(event.chain_drafted, event.chain_accepted, event.draft_confidence)
            # Δ = tokens · T(0) − (the step's seconds): what drafting saved against plain steps
            spent = event.draft_seconds + event.verify_seconds + event.sample_seconds
            self.saved += len(event.tokens) * self.plain_seconds() - spent
        self.confidence_seen = self.confidence_seen or bool(event.draft_confidence)


@dataclass
class PerSource:
    """One adaptive policy per drafter behind a hybrid: n-gram proposals cost nothing to draft
    and are right at other rates than the model's, so each learns its own K (and a hybrid
    whose draft model cannot win on this machine still takes the free n-gram drafts). The model's
    may be a fixed K (the one `bench` stored)."""

    policies: dict[Source, KPolicy] = field(default_factory=dict)
    costs: StepCosts | None = None  # the adaptive sides' shared costs, which this observes (else each its own)
    round: Round = ALONE  # the passes its steps are priced in (`share`)
    adapts = True

    def choose(self, source: Source = "model") -> int:
        if source not in self.policies:  # a grammar's forced tokens: as an adaptive side says, else all
            adaptive = [policy for policy in self.policies.values() if isinstance(policy, AdaptiveK)]
            return adaptive[0].forced_k() if adaptive else K_MAX
        return self.policies[source].choose(source)

    def keep_drafting(self, confidences: list[float]) -> bool:
        return self.policies["model"].keep_drafting(confidences)  # only a draft model drafts token by token

    def worth(self, confidences: list[float]) -> int:
        # Only a source of whole drafts (prompt lookup) proposes them with their evidence.
        whole = [policy for source, policy in self.policies.items() if source in WHOLE_DRAFTS]
        return whole[0].worth(confidences) if whole else len(confidences)

    @property
    def branches(self) -> bool:
        return self.policies["model"].branches

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        return self.policies["model"].branch(confidences, runner_up)

    def share(self, round: Round) -> None:
        before, self.round = self.round, round
        changed = self.costs is not None and reprice(self.costs, before, round, K_MAX)
        for policy in self.policies.values():
            if isinstance(policy, AdaptiveK):
                policy.share(round)
                if changed and not policy.owns_costs:
                    policy.worth_drafting = policy.config.k_min > 0 or policy.could_win()

    def drafts(self, source: Source = "model") -> bool:
        return source not in self.policies or self.policies[source].drafts(source)

    def expected(self, source: Source) -> np.ndarray | None:
        return self.policies[source].expected(source) if source in self.policies else None

    def speedup(self, source: Source) -> float | None:
        return self.policies[source].speedup(source) if source in self.policies else None

    def read_seconds(self, source: Source) -> float | None:
        return self.policies[source].read_seconds(source) if source in self.policies else None

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        return elapsed, event.draft_catchup_seconds

    def learned_costs(self) -> MachineCosts | None:
        if self.costs is not None:
            return None if self.round.lanes > 1 else self.costs.learned()
        adaptive = [policy for policy in self.policies.values() if isinstance(policy, AdaptiveK)]
        return adaptive[0].learned_costs() if adaptive else None

    def observe(self, event: StepEvent) -> None:
        if self.costs is not None:
            self.costs.observe(event)
        for policy in self.policies.values():
            policy.observe(event)  # each learns from its own drafter's steps, and all from plain ones


def adaptive_policy(
    kind: DrafterKind, costs: MachineCosts, config: PolicyConfig = PolicyConfig()
) -> AdaptiveK | PerSource:
    """The adaptive K policy for a drafter kind: one per source it drafts from."""
    spec = DRAFTER_KINDS[kind]
    if spec.mixed:
        shared = StepCosts(costs, trust=config.cost_trust)
        sides: dict[Source, KPolicy] = {
            source: AdaptiveK(costs, config, source=source, shared=shared) for source in spec.sources
        }
        return PerSource(sides, shared)
    return AdaptiveK(costs, config, source=spec.sources[0])
