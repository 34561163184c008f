"""How many tokens to draft next: a fixed K, or K chosen each step from measured costs.

The adaptive choice maximises expected tokens per second under this model:

- Draft position i (1-based) is accepted, given that positions 1..i-1 were, with
  probability c_i, estimated per position from decayed counts of drafted and
  accepted tokens (with a prior at the overall acceptance rate). A step with k
  drafts then emits E(k) = 1 + c_1 + c_1·c_2 + … + c_1·…·c_k tokens on average
  (accepted drafts plus the verifier's own token). Per-position rates matter:
  acceptance is bursty (a draft on a roll tends to stay right), so the i.i.d.
  geometric model of Leviathan et al. (2023, §3.4), E(k) = (1 − a^(k+1))/(1 − a),
  underestimates deep drafts; it is what you get here when every c_i is equal.
- A step costs T(k) = k · t_draft + t_verify(k): t_draft is the measured seconds
  per draft token, t_verify(k) the measured seconds to verify a batch of k + 1
  tokens, fitted as v0 + v1 · k by least squares over recent steps. On a CPU
  with a compute-bound verifier v1 is large (a batch of 9 costs ~3.6× one
  token); on a memory-bound one it is small (~1.7×), which is why K should differ.
- k = 0 is plain decoding: E = 1, T = t_verify(0). So when speculation loses,
  the policy falls back to plain by itself, and re-probes every `probe_every`
  steps in case the text became easier to draft. While speculating it tries
  k* + 2 every `explore_every` steps, to keep estimates for deeper positions.

K* = argmax over k_min ≤ k ≤ k_max of E(k) / T(k). Warm-up: one plain step (the
cost of one token), then one at `k_start`.
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


@dataclass
class AdaptiveK:
    k_max: int = 16
    k_min: int = 0  # 1 forces speculation (no fallback to plain)
    k_start: int = 6  # the first speculative step's K
    decay: float = 0.95  # weight of the past per step
    probe_every: int = 16
    explore_every: int = 8
    source: str = "draft"  # learn only from steps this drafter proposed
    draft_cost: float | None = None  # seconds per draft token
    verify_costs: dict[int, float] = field(default_factory=dict)  # k -> decayed seconds to verify k+1 tokens
    drafted: np.ndarray = field(default=None)  # decayed count of drafts at each position
    accepted: np.ndarray = field(default=None)  # ... and of those accepted
    steps: int = 0
    steps_since_probe: int = 0

    def __post_init__(self) -> None:
        self.drafted = np.zeros(self.k_max)
        self.accepted = np.zeros(self.k_max)

    @property
    def acceptance(self) -> float:
        """The overall acceptance rate, with a Beta(1, 1) prior."""
        return (self.accepted.sum() + 1.0) / (self.drafted.sum() + 2.0)

    def expected_by_k(self) -> np.ndarray:
        """E(k) for k = 0..k_max from per-position conditional acceptance c_i."""
        prior = self.acceptance
        conditional = (self.accepted + 2.0 * prior) / (self.drafted + 2.0)
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(conditional))])

    def verify_line(self) -> tuple[float, float]:
        """(v0, v1) with t_verify(k) = v0 + v1 * k, least squares over the measured batch sizes."""
        sizes = np.array(sorted(self.verify_costs), dtype=float)
        costs = np.array([self.verify_costs[int(size)] for size in sizes])
        if len(sizes) == 1:  # one size known: assume cost proportional to batch length for now
            per_token = float(costs[0]) / (1 + sizes[0])
            return per_token, per_token
        slope, intercept = np.polyfit(sizes, costs, 1)
        return float(intercept), float(slope)

    def best_k(self) -> int:
        v0, v1 = self.verify_line()
        ks = np.arange(self.k_max + 1)
        rates = self.expected_by_k() / (ks * self.draft_cost + np.maximum(v0 + v1 * ks, 1e-6))
        return self.k_min + int(np.argmax(rates[self.k_min:]))

    def choose(self) -> int:
        self.steps += 1
        if 0 not in self.verify_costs and self.k_min == 0:
            return 0  # warm-up: the cost of one plain token
        if self.draft_cost is None or len(self.verify_costs) < 2:
            return max(self.k_min, min(self.k_start, self.k_max))
        k = self.best_k()
        if k == 0:
            self.steps_since_probe += 1
            if self.steps_since_probe >= self.probe_every:
                self.steps_since_probe = 0
                return min(self.k_start, self.k_max)
        elif self.steps % self.explore_every == 0:
            return min(k + 2, self.k_max)
        return k

    def observe(self, event: StepEvent) -> None:
        if event.n_drafted and event.draft_source != self.source:
            return  # another drafter's step (e.g. an n-gram proposal): not this drafter's costs
        if not event.tokens and event.n_drafted == 0:
            return
        old = self.verify_costs.get(event.n_drafted)
        self.verify_costs[event.n_drafted] = event.verify_seconds if old is None else \
            self.decay * old + (1 - self.decay) * event.verify_seconds
        if event.n_drafted:
            per_token = event.draft_seconds / event.n_drafted
            self.draft_cost = per_token if self.draft_cost is None else \
                self.decay * self.draft_cost + (1 - self.decay) * per_token
            self.drafted *= self.decay
            self.accepted *= self.decay
            n_drafted = min(event.n_drafted, self.k_max)
            # Position i was tried only if every earlier one was accepted.
            self.drafted[:min(event.n_accepted + 1, n_drafted)] += 1
            self.accepted[:min(event.n_accepted, n_drafted)] += 1
