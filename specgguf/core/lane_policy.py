"""A request's K policy among the live requests' (serve --parallel), over the `KPolicy` protocol alone
(engine.py). Its steps are priced for the lanes live now (the policy's `share`), its K capped by the
round's (rounds.py: `round_k` where the lanes draft together, `lone_k` for a draft only this request
has), and it learns its rows' share of each batch's time, not the batch's wall time.

It reads its lane through the live sequences themselves (`LaneSequence`: llama/batcher.SequenceView),
so a step calls nothing above core: the server's part between steps (an editor's completion going
first) runs in the server's own loop over the steps (serve/generator.py).

Tested in tests/test_shared_rounds.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np

from .drafting import Source
from .engine import KPolicy
from .events import StepEvent
from .rounds import FREE, Line, Round, lone_k, round_k


class Participants(Protocol):
    @property
    def n_participants(self) -> int: ...  # the lanes live now (their threads take part in its batches)


class LaneSequence(Protocol):
    """What a request's policy reads of one model's live sequence (llama/batcher.SequenceView)."""

    @property
    def charged_seconds(self) -> float: ...  # its share, by rows, of its batches' time so far

    @property
    def batcher(self) -> Participants: ...

    def pass_line(self) -> tuple[float, float] | None: ...  # a pass's a + b·R as its decoder learned it


class SharedCosts:
    """A lane's K policy, taught what its steps cost in batches shared with the other lanes: its rows'
    share of each batch's time, not the batch's wall time.

    With n lanes in one pass of T(R) = a + b·R seconds for R rows, a step of k drafts is charged
    a/n + b·(k + 1): the fixed cost of reading the weights is shared, each extra row is not. Each
    lane maximising E(k) / (its charge) then maximises the lanes' tokens per second together
    (n·E(k) / T(n·(k + 1)) when they draft alike): the more clients, the less speculation pays on
    a verifier whose rows cost compute, and plain steps batched across clients take over. Before
    each step the policy's prior is set for the lanes live now (rounds.Round.prices)."""

    def __init__(
        self,
        policy: KPolicy,
        verifier: LaneSequence,
        draft: LaneSequence | None,
        live: set[SharedCosts],
        *,
        alone: bool = False,
    ):
        self.policy, self.live = policy, live  # live: the requests' policies running now
        self.verifier, self.draft = verifier, draft  # the lane's sequences (the draft's None without one)
        # A request whose passes are its own (serve --deterministic): its policy steps as alone, never
        # priced for the others (core/repeatable.py times its steps); it still gives way between steps.
        self.alone = alone
        self._marks = self.charged()

    def choose(self, source: Source = "model") -> int:
        self._marks = self.charged()  # a step starts: drafting and verifying are charged from here
        if self.alone:
            return self.policy.choose(source)
        n_lanes = self.verifier.batcher.n_participants
        verify, draft = self.pass_lines()
        self.policy.share(Round(n_lanes, verify, draft))  # priced for the lanes live now
        k = self.policy.choose(source)
        drafting = draft if source == "model" else FREE if source == "ngram" else None  # (a grammar's: free, sure)
        if n_lanes > 1 and verify is not None and drafting is not None:
            if source == "model":
                # The round's K (rounds.round_k): the lanes step together, and a lane drafting
                # longer than the others costs them all.
                expected = [e for shared in list(self.live) if (e := shared.expected(source)) is not None]
                k = min(k, round_k(expected, n_lanes=n_lanes, verify=verify, draft=drafting))
            elif (own := self.expected(source)) is not None:
                # An n-gram match is this request's alone: its drafts cost the round filler rows
                # or a pass of their own, and gain only its own tokens (rounds.lone_k).
                k = min(k, lone_k(own, n_lanes=n_lanes, verify=verify, draft=drafting))
        return k

    def expected(self, source: Source) -> np.ndarray | None:
        """E(k) of this request's drafts from `source`, as its policy prices them (KPolicy.expected)."""
        return self.policy.expected(source)

    def speedup(self, source: Source) -> float | None:
        return self.policy.speedup(source)

    def read_seconds(self, source: Source) -> float | None:
        return self.policy.read_seconds(source)

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        return self.policy.clock(event, elapsed)

    def keep_drafting(self, confidences: list[float]) -> bool:
        return self.policy.keep_drafting(confidences)

    def worth(self, confidences: list[float]) -> int:
        return self.policy.worth(confidences)  # priced for the round `choose` shared

    @property
    def adapts(self) -> bool:
        return self.policy.adapts

    def drafts(self, source: Source = "model") -> bool:
        return self.policy.drafts(source)

    def share(self, round: Round) -> None:
        self.policy.share(round)

    def learned_costs(self) -> None:
        """None: a share of passes shared with other lanes is not what a request alone costs."""
        return None

    @property
    def branches(self) -> bool:
        return self.policy.branches

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        return self.policy.branch(confidences, runner_up)

    def observe(self, event: StepEvent) -> None:
        if self.alone:
            self.policy.observe(event)
            return
        # Charged since the step began: marked by `choose`, or by the last step's end where the engine
        # stepped without asking for K (a draft model's reading deferred, core/drafting.py) — and never
        # more than the step's own wall time (a share of a pass is no more than the pass: the prompt's
        # pass, charged before an answer's first step, is not the step's).
        now = self.charged()
        verify, draft = (
            min(spent - mark, wall)
            for spent, mark, wall in zip(now, self._marks, (event.verify_seconds, event.draft_seconds))
        )
        self._marks = now
        catchup = event.draft_catchup_seconds * draft / event.draft_seconds if event.draft_seconds > 0 else 0.0
        charged = replace(event, verify_seconds=verify, draft_seconds=draft, draft_catchup_seconds=catchup)
        self.policy.observe(charged)

    def charged(self) -> tuple[float, float]:
        """The seconds charged so far to the lane's verifier and draft sequences (llama/batcher.py: each
        caller's share of its batches' time, by rows)."""
        return self.verifier.charged_seconds, 0.0 if self.draft is None else self.draft.charged_seconds

    def pass_lines(self) -> tuple[Line | None, Line | None]:
        """What a pass of the verifier and of the draft costs, as their decoders learned it (None until
        they have: llama/sequences.PassCosts; a test's fake decoder has none)."""
        lines = [None if view is None else view.pass_line() for view in (self.verifier, self.draft)]
        verify, draft = (None if line is None else Line(*line) for line in lines)
        return verify, draft
