"""The live sequences of `serve --parallel N`: N `Lane`s, each a KV sequence of the verifier and one
of the draft (llama/batcher.py's views over one context per model): which lane a request takes, an
editor's completion first (the others give way, between their steps: `between_steps`, which the
server's loop over a request's steps calls), and the round policy each request steps under
(core/lane_policy.py, over the lane's two sequences).

The lanes are the server's cached conversations, kept live. A request takes, in this order: the free
lane whose last prompt it continues (all of it but the last token: a chat's follow-up), for a
fill-in-the-middle request also a lane whose last completion it shares at least half of (an editor's
completions supersede each other: the same file, the cursor moved), the longest shared prefix first —
waiting up to CONTINUE_WAIT for such a lane that is still busy; else an empty lane (a new conversation
that shares only a system prompt does not end another); else the lane where it keeps the most cached
tokens less those it throws away, then the least recently used. While its request runs, a lane's thread
is a participant of both models' batchers: their batches wait for it (briefly) and take its rows along.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...core.drafting import common_prefix
from ...core.engine import KPolicy
from ...core.hot_vocab import HotVocab
from ...core.lane_policy import SharedCosts

# How long a verify waits for the other live requests (those still drafting, or sampling) to bring
# their rows: the lanes then verify together, a round at a time, and draft together after it.
ROUND_WAIT = 0.5
# An editor's fill-in-the-middle request goes first (the other requests wait between their steps,
# out of the batches: an answer of a few tokens should not share each pass with a long chat), but
# only for its first PRIORITY_TOKENS tokens and PRIORITY_SECONDS from its start, prompt included:
# llama.vscode asks for 128 tokens (n_predict) and allots 500 ms to the prompt and 500 ms to the
# answer (t_max_prompt_ms, t_max_predict_ms), so an editor's ordinary completion goes first whole.
# After that it steps like any other request. A request waits at most GIVE_WAY seconds at a time,
# and after a wait it steps for as long as it waited before it gives way again: whatever stream of
# completions comes, it is held back at most half of the time.
PRIORITY_TOKENS, PRIORITY_SECONDS = 128, 2.0
GIVE_WAY = 1.0
# A request that continues a busy lane's conversation waits up to this long for that lane. A client
# sends its next request as soon as the last event of the one before arrives, which is before that
# request's thread has let its lane go: taking a free lane then read the whole prompt again (an
# editor's 600 tokens, 3.6 s on the Q4_K_M pair; a chat's whole history). An editor that moves on
# hangs up, and the lane is let go at its request's next step; a second client going on at once
# from the same conversation waits this long at most.
CONTINUE_WAIT = 1.0


@dataclass(eq=False)
class Lane:
    """One live sequence: the verifier's view and the draft's (None without a draft model)."""

    index: int
    verifier: Any  # batcher.SequenceView
    draft: Any  # a SequenceView, or a HotVocab over one; None without a draft model
    busy: bool = False
    used: float = field(default_factory=time.monotonic)
    prompt: list[int] = field(default_factory=list)  # the last prompt answered here
    fim: bool = False  # ... a fill-in-the-middle one
    first_until: float = 0.0  # (time.monotonic) its fill-in-the-middle request goes first until then; 0: it does not
    steps_until: float = 0.0  # its request gave way just before: until then it steps without giving way

    @contextlib.contextmanager
    def live(self, *, alone: bool = False) -> Iterator[None]:
        """While a request runs here: its thread takes part in both models' batches, or (`alone`: serve
        --deterministic) its rows go in passes of their own and no batch waits for it."""
        views = [view for view in (self.verifier, self.draft_sequence) if view is not None]
        for view in views:
            view.alone = alone
        try:
            with self._each_view(lambda view: view.participant()):
                yield
        finally:
            for view in views:
                view.alone = False

    def away(self) -> contextlib.AbstractContextManager[None]:
        """While this request waits between its steps: both models' batches no longer wait for it."""
        return self._each_view(lambda view: view.away())

    @contextlib.contextmanager
    def _each_view(self, state: Callable[[Any], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for view in (self.verifier, self.draft):
                if view is not None:
                    stack.enter_context(state(view))
            yield

    def clear(self) -> None:
        """After a failure inside a model call: this lane's caches hold what their lists may not say."""
        for view in (self.verifier, self.draft):
            if view is not None:
                view.clear()

    @property
    def draft_sequence(self) -> Any:
        """The draft model's sequence view (under a hot-vocabulary draft, the view it maps), or None."""
        return self.draft.model if isinstance(self.draft, HotVocab) else self.draft


def draft_views(draft: Any, n_seq: int) -> list[Any]:
    """The draft's sequences (its pass costs measured first); a hot-vocabulary draft (core/hot_vocab.py)
    keeps its maps over each."""
    if isinstance(draft, HotVocab):
        return [HotVocab(view, draft.ids, draft.feed, draft.rows) for view in draft_views(draft.model, n_seq)]
    return draft.sequences(n_seq, calibrate=True)


class Lanes:
    def __init__(self, verifier: Any, draft: Any, n_seq: int):
        # Both models' pass costs are measured before the first request (LlamaDecoder.calibrate): the
        # first rounds are priced by them (round_k), not drafted at K_MAX until the requests teach them.
        verifiers = verifier.sequences(n_seq, wait_seconds=ROUND_WAIT, calibrate=True)
        drafts = draft_views(draft, n_seq) if draft is not None else [None] * n_seq
        self.lanes = [Lane(index, view, drafts[index]) for index, view in enumerate(verifiers)]
        for lane in self.lanes:  # a lane reading a prompt on one model brings no rows to the other's batches
            if (draft_view := lane.draft_sequence) is not None:
                lane.verifier.partners, draft_view.partners = [draft_view], [lane.verifier]
        self._lock = threading.Condition()  # guards the lanes' busy, prompt and used; notified when one is let go
        self._live: set[SharedCosts] = set()
        self._urgent = threading.Condition()  # guards the lanes' first_until; notified when one ends

    def acquire(self, prompt: list[int], *, fim: bool = False, fresh: bool = False) -> Lane:
        """The free lane for `prompt` (one is free: a thread per lane asks), as the docstring above says;
        `fim`: a fill-in-the-middle request; `fresh`: one that keeps no cache (serve --deterministic),
        so past its own conversation and an empty lane it takes the least recently used one."""
        with self._lock:
            deadline = time.monotonic() + CONTINUE_WAIT
            while (lane := self._choose(prompt, fim=fim, fresh=fresh, wait_until=deadline)) is None:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            lane.busy, lane.prompt, lane.fim, lane.steps_until = True, list(prompt), fim, 0.0
            return lane

    def _choose(self, prompt: list[int], *, fim: bool, fresh: bool, wait_until: float) -> Lane | None:
        """The free lane for `prompt` (under the lock), or None to wait: a busy lane's conversation is
        the one this prompt continues, and it may be let go before `wait_until`."""
        free = [lane for lane in self.lanes if not lane.busy]
        kept = {lane.index: common_prefix(lane.verifier.cached, prompt) for lane in free}

        def continued(lane: Lane) -> bool:
            shared = common_prefix(lane.prompt, prompt)
            return bool(lane.prompt) and (
                shared >= len(lane.prompt) - 1 or (fim and lane.fim and 2 * shared >= len(lane.prompt))
            )

        def value(lane: Lane) -> tuple[int, int, float]:
            evicted = lane.verifier.n_past - kept[lane.index]
            return kept[lane.index] - evicted, -evicted, -lane.used

        if going_on := [lane for lane in free if continued(lane)]:
            return max(going_on, key=lambda lane: (kept[lane.index], -lane.used))
        if not fresh and time.monotonic() < wait_until and any(lane.busy and continued(lane) for lane in self.lanes):
            return None
        if empty := [lane for lane in free if not lane.verifier.n_past]:
            return max(empty, key=lambda lane: -lane.used)
        if fresh:
            return max(free, key=lambda lane: -lane.used)
        return max(free, key=value)

    @contextlib.contextmanager
    def shared(self, policy: KPolicy, lane: Lane, *, alone: bool = False) -> Iterator[SharedCosts]:
        """`policy`, for a request running on `lane`, among the live requests' (SharedCosts); `alone`
        (serve --deterministic): priced and capped as a request alone, and no other's round counts it."""
        shared = SharedCosts(policy, lane.verifier, lane.draft_sequence, set() if alone else self._live, alone=alone)
        if not alone:
            self._live.add(shared)
        if lane.fim:
            with self._urgent:
                lane.first_until = time.monotonic() + PRIORITY_SECONDS
        try:
            yield shared
        finally:
            self._live.discard(shared)
            self._priority_ends(lane)

    def between_steps(self, lane: Lane) -> None:
        """(A request's thread, between its steps.) A fill-in-the-middle request goes first for its
        first PRIORITY_TOKENS tokens and PRIORITY_SECONDS; any other request gives way to it."""
        generated = lane.verifier.n_past - len(lane.prompt)  # (its tokens so far, the prompt read)
        if lane.first_until > time.monotonic() and generated < PRIORITY_TOKENS:
            return  # it goes first: it waits for no one
        self._priority_ends(lane)
        self.give_way(lane)

    def _priority_ends(self, lane: Lane) -> None:
        """`lane`'s request no longer goes first (its priority spent, or it ended)."""
        with self._urgent:
            if lane.first_until:
                lane.first_until = 0.0
                self._urgent.notify_all()

    def _priority_left(self) -> float:
        """(Holding `_urgent`.) Seconds until no request goes first (0: none does now)."""
        now = time.monotonic()
        return max([lane.first_until - now for lane in self.lanes if lane.first_until] + [0.0])

    def give_way(self, lane: Lane) -> None:
        """(A request's thread, between its steps.) While a request goes first on another lane, wait
        out of both models' batches, at most GIVE_WAY seconds: an editor's completion of a few tokens
        then takes its passes alone (their rows and its prompt's), instead of sharing each with this
        request's rows. After a wait the request steps for as long as it waited before it gives way
        again, so no stream of completions holds it back more than half of the time."""
        with self._urgent:
            if time.monotonic() < lane.steps_until or not self._priority_left():
                return
        with lane.away(), self._urgent:
            started = time.monotonic()
            self._urgent.wait_for(lambda: not self._priority_left(), timeout=min(GIVE_WAY, self._priority_left()))
            now = time.monotonic()
            lane.steps_until = now + (now - started)

    def release(self, lane: Lane) -> None:
        with self._lock:
            lane.busy, lane.used = False, time.monotonic()
            self._lock.notify_all()
