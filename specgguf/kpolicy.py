"""How many tokens to draft next: a fixed K, or K chosen each step from measured costs.

The adaptive choice maximises expected tokens per second under a simple model:

- Each draft token is accepted with probability `a`, independently (the
  approximation of Leviathan et al. 2023, §3.4). A step with k drafts then emits
  E(k) = 1 + a + a² + … + a^k = (1 − a^(k+1)) / (1 − a) tokens on average
  (accepted drafts plus the verifier's own token).
- It costs T(k) = k · t_draft + t_verify(k): t_draft is the measured seconds per
  draft token, t_verify(k) the measured seconds to verify a batch of k + 1
  tokens, fitted as v0 + v1 · k by least squares over recent steps. On a CPU
  with a compute-bound verifier v1 is large (a batch of 5 costs ~3× one token);
  on a memory-bound one it is small (~1.1×), which is exactly why K should differ.
- k = 0 is plain decoding: E = 1, T = t_verify(0). So when speculation loses,
  the policy falls back to plain by itself, and re-probes now and then (every
  `probe_every` steps) in case the text became easier to draft.

K* = argmax over 0 ≤ k ≤ k_max of E(k) / T(k). `a` is a decayed count of
accepted vs rejected drafts with a Beta(1, 1) prior; costs are decayed averages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import FixedK, StepEvent  # noqa: F401 - FixedK re-exported


def expected_tokens(acceptance: float, k: int) -> float:
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass
class AdaptiveK:
    k_max: int = 16
    k_min: int = 0  # 1 forces speculation (no fallback to plain)
    decay: float = 0.9  # weight of the past per step
    probe_every: int = 16
    source: str = "draft"  # learn only from steps this drafter proposed
    accepted: float = 0.0
    rejected: float = 0.0
    draft_cost: float | None = None  # seconds per draft token
    verify_costs: dict[int, float] = field(default_factory=dict)  # k -> decayed seconds to verify k+1 tokens
    steps_since_probe: int = 0
    last_k: int = 0

    @property
    def acceptance(self) -> float:
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def verify_line(self) -> tuple[float, float]:
        """(v0, v1) with t_verify(k) = v0 + v1 * k, least squares over the measured batch sizes."""
        sizes = np.array(sorted(self.verify_costs), dtype=float)
        costs = np.array([self.verify_costs[int(size)] for size in sizes])
        if len(sizes) == 1:  # one size known: assume cost proportional to batch length for now
            per_token = float(costs[0]) / (1 + sizes[0])
            return per_token, per_token
        slope, intercept = np.polyfit(sizes, costs, 1)
        return float(intercept), float(slope)

    def choose(self) -> int:
        # Warm-up: one plain step (the cost of a single token), then one at k_max.
        if 0 not in self.verify_costs and self.k_min == 0:
            k = 0
        elif self.draft_cost is None or len(self.verify_costs) < 2:
            k = self.k_max
        else:
            v0, v1 = self.verify_line()
            rates = [expected_tokens(self.acceptance, k) / (k * self.draft_cost + max(v0 + v1 * k, 1e-6))
                     for k in range(self.k_min, self.k_max + 1)]
            k = self.k_min + int(np.argmax(rates))
            if k == 0:
                self.steps_since_probe += 1
                if self.steps_since_probe >= self.probe_every:
                    self.steps_since_probe = 0
                    k = max(self.last_k, 2)
        if k > 0:
            self.last_k = k
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
            self.accepted = self.decay * self.accepted + event.n_accepted
            self.rejected = self.decay * self.rejected + (1 if event.n_accepted < event.n_drafted else 0)
