"""How many tokens to draft next: a fixed K, or K chosen each step from measured costs.

The adaptive policy maximises expected tokens per second under this model:

- Draft position i (1-based) is accepted, given that positions 1..i-1 were, with
  probability c_i, estimated per position from decayed counts of drafted and
  accepted tokens (with a prior at the overall acceptance rate). A step with k
  drafts then emits E(k) = 1 + c_1 + c_1·c_2 + … + c_1·…·c_k tokens on average
  (accepted drafts plus the verifier's own token). Per-position rates matter:
  acceptance is bursty (a draft on a roll tends to stay right), so the i.i.d.
  geometric model of Leviathan et al. (2023, §3.4), E(k) = (1 − a^(k+1))/(1 − a),
  underestimates deep drafts; it is what you get here when every c_i is equal.
- A step costs T(k) = k · t_draft + t_verify(k) + overhead: t_draft is the
  measured seconds per draft token; t_verify(k) is the seconds to verify a batch
  of k + 1 tokens. With a verify-cost table (`verify_profile`, measured by
  `bench`: verify_costs.py), t_verify(k) = table[k] · s, where s, the ratio of
  measured to tabled cost over the steps run so far, follows context length and
  machine load; the table keeps llama.cpp's irregular kernel costs (on this
  machine a batch of 16 tokens verifies faster than one of 12). Without one,
  t_verify(k) = v0 + v1 · k, fitted by least squares over the batch sizes seen
  with drafts. Either way t_verify(0), a single token (plain decoding), is kept
  as measured: llama.cpp runs it through cheaper matrix-vector kernels. Measured
  here with the 1.5B verifier: Q4_K_M (compute-bound) 35 ms for one token, 59 ms
  for two, about +20 ms per further token; F16 (memory-bound) 79 ms, 124 ms, +14 ms.
- k = 0 is plain decoding: E = 1, T = t_verify(0). K* = argmax over
  k_min ≤ k ≤ k_max of E(k) / T(k). When K* = 0 speculation is losing and the
  policy decodes plain, probing with one draft of the best k ≥ 1 after
  `probe_every` plain steps, then after twice as many following each probe that
  did not win speculation back (up to `max_probe_interval`); it never probes when
  even drafts that were always accepted would lose (a probe is not free: the draft
  model first reads every token decoded without it). It gives up only
  once c_1 is known well enough: if c_1 raised by `doubt` standard errors (an
  upper confidence bound) would still make some k ≥ 1 win, it keeps speculating.
  Giving up on a few unlucky drafts costs more than a few more drafts do.

How long each draft is: with a draft model, which reports its top probability for
every token it proposes, K* ≥ 1 only says "speculate" and the draft stops when
`keep_drafting` says another token no longer raises the step's tokens per second,
judged from the draft's confidence calibrated online against what the verifier
accepted (the rule is in its docstring). This is llama.cpp's `--draft-p-min`
with the threshold derived from measured costs instead of fixed: it drafts deep
through confident runs on a memory-bound verifier and stops at the first unsure
token on a compute-bound one. Proposers without a confidence (prompt lookup) draft
K* tokens, and every `explore_every` steps K* + 2, to keep estimates for deeper
positions.

Warm-up: one plain step (the cost of one token), then one draft of `k_start`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import StepEvent


def expected_tokens(acceptance: float, k: int) -> float:
    """E(k) when every position has the same acceptance (the geometric special case)."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


# Bins of the draft's top probability for calibration: finer near 1, where most drafts are.
CONFIDENCE_EDGES = np.array([0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995])


def confidence_bins(confidences):
    """The calibration bin of each top probability (0 .. len(CONFIDENCE_EDGES))."""
    return np.searchsorted(CONFIDENCE_EDGES, confidences, side="right")


@dataclass
class AdaptiveK:
    k_max: int = 16
    k_min: int = 0  # 1 forces speculation (no fallback to plain)
    k_start: int = 6  # the first speculative step's K
    decay: float = 0.95  # weight of the past per step
    probe_every: int = 16  # plain steps before the first probe; doubles after each lost probe ...
    max_probe_interval: int = 128  # ... up to this
    explore_every: int = 8
    replain_every: int = 32  # speculative steps between plain steps that re-measure plain's cost
    source: str = "draft"  # learn only from steps this drafter proposed
    draft_cost: float | None = None  # seconds per draft token
    verify_profile: np.ndarray | None = None  # measured seconds to verify k + 1 tokens, k = 0, 1, …
    profile_scale: float = 1.0  # measured / tabled verify seconds, decayed mean over steps with drafts
    profile_trust: int = 3  # the table counts as this many steps at scale 1 (a cold first step is slow)
    verify_costs: dict[int, float] = field(default_factory=dict)  # k -> decayed seconds to verify k+1 tokens
    samples: dict = field(default_factory=dict)  # how many timings each estimate has seen
    drafted: np.ndarray = field(default=None)  # decayed count of drafts at each position
    accepted: np.ndarray = field(default=None)  # ... and of those accepted
    doubt: float = 2.0  # standard errors of optimism about c_1 before falling back to plain
    step_overhead: float = 0.0  # seconds per step outside drafting and verifying (sampling, rollback)
    calibration_decay: float = 0.995  # slower: each bin sees only some of the drafts
    tried_by_confidence: np.ndarray = field(default=None)  # decayed drafts the rule tested, per bin
    accepted_by_confidence: np.ndarray = field(default=None)  # ... and of those accepted
    confidence_seen: bool = False  # the drafter reports confidence: `keep_drafting` sets the length
    steps: int = 0
    steps_since_probe: int = 0
    steps_since_plain: int = 0
    probe_interval: int = 0  # set from probe_every

    def __post_init__(self) -> None:
        self.drafted = np.zeros(self.k_max)
        self.accepted = np.zeros(self.k_max)
        self.probe_interval = self.probe_every
        self.tried_by_confidence = np.zeros(len(CONFIDENCE_EDGES) + 1)
        self.accepted_by_confidence = np.zeros(len(CONFIDENCE_EDGES) + 1)
        self.samples["scale"] = self.profile_trust

    @property
    def acceptance(self) -> float:
        """The overall acceptance rate, with a Beta(1, 1) prior."""
        return (self.accepted.sum() + 1.0) / (self.drafted.sum() + 2.0)

    def expected_by_k(self, optimism: float = 0.0) -> np.ndarray:
        """E(k) for k = 0..k_max from per-position conditional acceptance c_i. `optimism` raises
        c_1 by that many standard errors (an upper confidence bound): the first position is the
        one every speculative step tests, so its evidence is what decides against speculating.

        Each c_i is shrunk towards c_(i-1) (c_1 towards the overall rate) with the weight of two
        drafts: a position rarely tried takes the rate of the one before it. Acceptance given
        that every earlier draft was right rarely falls with depth (drafts come right in runs), so
        a deep position seen once failing does not condemn deep drafts for dozens of steps."""
        conditional = np.empty(self.k_max)
        prior = self.acceptance
        for i in range(self.k_max):
            prior = conditional[i] = (self.accepted[i] + 2.0 * prior) / (self.drafted[i] + 2.0)
        if optimism:
            first = conditional[0]
            conditional[0] = min(1.0, first + optimism * np.sqrt(first * (1.0 - first) / (self.drafted[0] + 2.0)))
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(conditional))])

    def verify_line(self) -> tuple[float, float]:
        """(v0, v1) with t_verify(k) = v0 + v1·k for k ≥ 1: least squares over the measured
        batch sizes with drafts. A batch of one token (plain, k = 0) is left out: llama.cpp runs
        it through matrix-vector kernels, cheaper than the line (F16 1.5B here: 79 ms for one
        token, 124 ms for two, then +14 ms per token)."""
        sizes = sorted(k for k in self.verify_costs if k > 0)
        if len(sizes) < 2:  # too few to fit without plain's point
            sizes = sorted(self.verify_costs)
        if len(sizes) < 2:  # one size known: assume cost proportional to batch length for now
            (size, cost), = self.verify_costs.items()
            return cost / (1 + size), cost / (1 + size)
        costs = np.array([self.verify_costs[size] for size in sizes])
        sizes = np.array(sizes, dtype=float)
        slope, intercept = np.polyfit(sizes, costs, 1)
        return float(intercept), float(slope)

    def verify_seconds(self, ks) -> np.ndarray:
        """Predicted seconds to verify k drafts (a batch of k + 1 tokens), k = 0 as measured."""
        ks = np.asarray(ks)
        if self.verify_profile is not None:
            predicted = self._tabled(ks) * self.profile_scale
            plain = self.verify_costs.get(0, float(self.verify_profile[0]) * self.profile_scale)
        else:
            v0, v1 = self.verify_line()
            predicted, plain = np.maximum(v0 + v1 * ks, 1e-6), self.verify_costs.get(0, v0)
        return np.where(ks == 0, plain, predicted)

    def _tabled(self, ks: np.ndarray) -> np.ndarray:
        """verify_profile[k]; past its end, extended by its last step."""
        table = self.verify_profile
        last = len(table) - 1
        step = table[last] - table[last - 1]
        return np.where(ks <= last, table[np.minimum(ks, last)], table[last] + step * (ks - last))

    def step_seconds(self) -> np.ndarray:
        """T(k) for k = 0..k_max."""
        ks = np.arange(self.k_max + 1)
        return ks * self.draft_cost + self.verify_seconds(ks) + self.step_overhead

    def rates(self, optimism: float = 0.0) -> np.ndarray:
        """Expected tokens per second E(k) / T(k) for k = 0..k_max."""
        return self.expected_by_k(optimism) / self.step_seconds()

    def best_k(self) -> int:
        rates = self.rates()
        k = self.k_min + int(np.argmax(rates[self.k_min:]))
        if k == 0 and self.rates(optimism=self.doubt)[1:].max() > rates[0]:
            # Plain looks best, but with `doubt` standard errors speculation still wins: the
            # estimates rest on too few drafts to give up on it yet (a wrong "plain" is costly:
            # it is only re-probed now and then).
            k = 1 + int(np.argmax(rates[1:]))
        return k

    def could_win(self) -> bool:
        """Would speculation beat plain decoding if every draft were accepted? If not, probing
        is pointless (a compute-bound verifier with a draft model that is not much cheaper)."""
        ceiling = np.arange(1, self.k_max + 2) / self.step_seconds()
        return bool(ceiling[1:].max() > ceiling[0])

    def choose(self, source: str = "draft") -> int:
        self.steps += 1
        if 0 not in self.verify_costs and self.k_min == 0:
            return 0  # warm-up: the cost of one plain token
        if self.draft_cost is None or len(self.verify_costs) < 2:
            return max(self.k_min, min(self.k_start, self.k_max))
        k = self.best_k()
        if k == 0:
            self.steps_since_plain = 0
            self.steps_since_probe += 1
            if self.steps_since_probe < self.probe_interval or not self.could_win():
                return 0
            # Probe: one draft of the best length, in case the text became easier to draft.
            # Each probe that does not win speculation back doubles the wait for the next
            # (a probe costs: the draft model first reads every token decoded without it).
            self.steps_since_probe = 0
            self.probe_interval = min(2 * self.probe_interval, self.max_probe_interval)
            return 1 + int(np.argmax(self.rates()[1:]))
        self.probe_interval, self.steps_since_probe = self.probe_every, 0
        self.steps_since_plain += 1
        if self.k_min == 0 and self.steps_since_plain > self.replain_every:
            self.steps_since_plain = 0
            return 0  # plain's cost is measured only on plain steps: refresh it now and then
        if self.confidence_seen:
            return self.k_max  # a cap: `keep_drafting` ends the draft
        if self.steps % self.explore_every == 0:
            return min(k + 2, self.k_max)
        return k

    def calibrated(self, confidence: float) -> float:
        """Chance the verifier accepts a draft of this top probability (earlier drafts accepted):
        decayed counts in its confidence bin, with the confidence itself as a prior worth 2 drafts."""
        b = int(confidence_bins(confidence))
        return (self.accepted_by_confidence[b] + 2.0 * confidence) / (self.tried_by_confidence[b] + 2.0)

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Draft one more token? Asked after each draft with the draft's top probabilities so far.

        With i drafts of confidence c_1..c_i, P_j = a(c_1)·…·a(c_j) is the chance
        that the first j are all accepted (a = `calibrated`), the step yields
        E_i = 1 + P_1 + … + P_i tokens on average and costs
        T_i = i·t_draft + t_verify(i) + overhead seconds. Drafting on to j > i
        drafts, each as sure as the last (confidence runs in streaks), would yield
        E_j = E_i + P_i·(a + a² + … + a^(j−i)) with a = a(c_i), for T_j seconds.
        Go on iff some j ≤ k_max beats E_i / T_i. Looking past the next draft
        matters with a measured verify table: its steps are irregular (here one
        more token can add 45 ms at one size and 3 ms at the next), so a draft can
        be worth going on with although the very next one, alone, is not. With a
        straight line this is the one-step test P_i·a / (t_draft + v1) > E_i / T_i.
        """
        if not self.confidence_seen or self.draft_cost is None or len(self.verify_costs) < 2:
            return True  # warm-up: the length `choose` gave
        n = len(confidences)
        if n >= self.k_max:
            return False
        acceptance = np.array([self.calibrated(c) for c in confidences])
        all_accepted = np.cumprod(acceptance)
        lengths = np.arange(n, self.k_max + 1)
        streak = all_accepted[-1] * np.cumsum(acceptance[-1] ** np.arange(1, len(lengths)))
        expected = 1.0 + all_accepted.sum() + np.concatenate([[0.0], streak])
        seconds = lengths * self.draft_cost + self.verify_seconds(lengths) + self.step_overhead
        if self.verify_profile is None:
            seconds = np.maximum.accumulate(seconds)  # a line's negative slope is noise, not free drafts
        rates = expected / seconds
        return bool(rates[1:].max() > rates[0])

    def _average(self, key, old: float | None, new: float) -> float:
        """Decayed mean of a timing; the first samples count equally (a cold first step must
        not dominate the estimate, which for plain steps is rarely refreshed)."""
        self.samples[key] = n = self.samples.get(key, 0) + 1
        weight = max(1.0 - self.decay, 1.0 / n)
        return new if old is None else (1.0 - weight) * old + weight * new

    def observe(self, event: StepEvent) -> None:
        if event.n_drafted and event.draft_source != self.source:
            return  # another drafter's step (e.g. an n-gram proposal): not this drafter's costs
        if not event.tokens and event.n_drafted == 0:
            return
        self.step_overhead = self._average("overhead", self.step_overhead, event.sample_seconds)
        k = event.n_drafted
        self.verify_costs[k] = self._average(k, self.verify_costs.get(k), event.verify_seconds)
        if k and self.verify_profile is not None:
            ratio = event.verify_seconds / float(self._tabled(np.array(k)))
            self.profile_scale = self._average("scale", self.profile_scale, ratio)
        if k:
            per_token = (event.draft_seconds - event.draft_catchup_seconds) / k
            self.draft_cost = self._average("draft", self.draft_cost, per_token)
            self.drafted *= self.decay
            self.accepted *= self.decay
            n_drafted = min(event.n_drafted, self.k_max)
            # Position i was tried only if every earlier one was accepted.
            self.drafted[:min(event.n_accepted + 1, n_drafted)] += 1
            self.accepted[:min(event.n_accepted, n_drafted)] += 1
        if event.draft_confidence:
            self.confidence_seen = True
            self.tried_by_confidence *= self.calibration_decay
            self.accepted_by_confidence *= self.calibration_decay
            tested = event.draft_confidence[:event.n_accepted + 1]
            bins = confidence_bins(tested)
            np.add.at(self.tried_by_confidence, bins, 1.0)
            np.add.at(self.accepted_by_confidence, bins[:event.n_accepted], 1.0)


class PerSource:
    """One adaptive policy per drafter behind a hybrid: n-gram proposals cost nothing to draft
    and are right at other rates than the model's, so each learns its own K (and a hybrid
    whose draft model loses on this machine still takes the free n-gram drafts)."""

    def __init__(self, policies: dict[str, AdaptiveK]):
        self.policies = policies

    def choose(self, source: str = "draft") -> int:
        return self.policies[source].choose(source)

    def keep_drafting(self, confidences: list[float]) -> bool:
        return self.policies["draft"].keep_drafting(confidences)  # only a draft model knows its confidence

    def observe(self, event: StepEvent) -> None:
        for policy in self.policies.values():
            policy.observe(event)  # each learns from its own drafter's steps, and all from plain ones


def adaptive_policy(drafter: str, *, k_max: int, k_min: int = 0,
                    verify_profile: list[float] | None = None) -> AdaptiveK | PerSource:
    """The adaptive K policy for a drafter kind as the CLI names it ("model", "ngram", "hybrid");
    `verify_profile`: seconds to verify 1, 2, … tokens on this machine (verify_costs.py), if measured."""
    table = None if verify_profile is None or len(verify_profile) < 2 else np.asarray(verify_profile, dtype=float)

    def policy(source: str) -> AdaptiveK:
        return AdaptiveK(k_max=k_max, k_min=k_min, source=source, verify_profile=table)

    if drafter == "hybrid":
        return PerSource({source: policy(source) for source in ("draft", "ngram")})
    return policy("ngram" if drafter == "ngram" else "draft")
