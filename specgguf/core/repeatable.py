"""A K policy whose choices follow from the request's own tokens alone (serve --deterministic).

An adaptive policy (kpolicy.py) learns what a step costs from the seconds it took, and those depend
on whatever else the machine runs: another client's rows in the same pass, a busy core. Its K then
changes with them, and K sets the shape of each verify pass (K + 1 rows), which llama.cpp's logits
depend on in their last bits (4-row kernel groups and the rest on x86): a near-tie can then go the
other way. `Repeatable` shows the policy each step's seconds as the machine's costs measured before
the request say (`MachineCosts`, fixed for the server's life), not as the clock did: the policy still
learns the request's acceptance from its tokens, and its K is a function of those tokens alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .costs import MachineCosts
from .drafting import Source
from .engine import KPolicy, StepEvent
from .rounds import Round


def repeatable(policy: KPolicy, costs: Callable[[], MachineCosts]) -> KPolicy:
    """A deterministic request's policy: `Repeatable` wherever its steps could follow the clock, an
    adaptive K (what it learns of the costs) or any K that drafts with a draft model (when the draft
    reads a long prompt it has not read); `costs` (the machine's, measured at start-up) asked only then."""
    return Repeatable(policy, costs()) if policy.adapts or policy.drafts("model") else policy


def table_seconds(costs: MachineCosts, rows: int) -> float:
    """Seconds the costs' table gives a verify pass of `rows` rows (past the table: its last slope)."""
    verify = costs.verify
    if rows <= len(verify):
        return verify[max(rows, 1) - 1]
    return verify[-1] + (rows - len(verify)) * max(0.0, verify[-1] - verify[-2])


@dataclass
class Repeatable:
    """`policy`, seeing each step timed by `costs` instead of the clock."""

    policy: KPolicy
    costs: MachineCosts

    def observe(self, event: StepEvent) -> None:
        self.policy.observe(self._timed(event))

    def _timed(self, event: StepEvent) -> StepEvent:
        """The step as the costs time it: its pass by the table, each draft model token at its cost."""
        drafted = event.n_drafted if event.draft_source == "model" else 0  # n-gram and grammar drafts are free
        return replace(
            event,
            verify_seconds=table_seconds(self.costs, event.n_drafted + 1),
            draft_seconds=self.costs.draft * drafted,
            sample_seconds=0.0,
            prefill_seconds=0.0,
            draft_catchup_seconds=0.0,
        )

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        """The step as the costs time it, and no catch-up: the reading keeps the measured cost a token
        (`read_seconds`), and the draft reads a long prompt after the same steps whatever the clock says."""
        timed = self._timed(event)
        return timed.draft_seconds + timed.verify_seconds, 0.0

    def learned_costs(self) -> None:
        """None: it learns no costs (what it was shown are the costs it was given)."""
        return None

    def choose(self, source: Source = "model") -> int:
        return self.policy.choose(source)

    def keep_drafting(self, confidences: list[float]) -> bool:
        return self.policy.keep_drafting(confidences)

    def worth(self, confidences: list[float]) -> int:
        return self.policy.worth(confidences)

    @property
    def branches(self) -> bool:
        return self.policy.branches

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        return self.policy.branch(confidences, runner_up)

    @property
    def adapts(self) -> bool:
        return self.policy.adapts

    def drafts(self, source: Source = "model") -> bool:
        return self.policy.drafts(source)

    def expected(self, source: Source) -> np.ndarray | None:
        return self.policy.expected(source)

    def speedup(self, source: Source) -> float | None:
        return self.policy.speedup(source)

    def read_seconds(self, source: Source) -> float | None:
        return self.policy.read_seconds(source)

    def share(self, round: Round) -> None:
        """Never priced for shared passes: a deterministic request's passes are its own."""
