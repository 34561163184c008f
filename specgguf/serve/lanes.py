"""The live sequences of `serve --parallel N`: N `Lane`s, each a KV sequence of the verifier and one
of the draft (llama/batcher.py's views over one context per model), and how many fit.

The lanes are the server's cached conversations, kept live. A request takes, in this order: the free
lane whose last prompt it continues (all of it but the last token: a chat's follow-up), for a
fill-in-the-middle request also a lane whose last completion it shares at least half of (an editor's
completions supersede each other: the same file, the cursor moved), the longest shared prefix
first; else an empty lane (a new conversation that shares only a system prompt does not end
another); else the lane where it keeps the most cached tokens less those it throws away, then the
least recently used. While
its request runs, a lane's thread is a participant of both models' batchers: their batches wait for
it (briefly) and take its rows along.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.drafting import common_prefix
from ..core.hot_vocab import HotVocab

MIN_PARALLEL, MAX_AUTO_PARALLEL = 2, 4  # --parallel's default: at least 2, at most 4, as memory allows
MEMORY_SHARE = 0.5  # of the memory free after loading, what the default lets the sequences take


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

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """While a request runs here: its thread takes part in both models' batches."""
        with contextlib.ExitStack() as stack:
            for view in (self.verifier, self.draft):
                if view is not None:
                    stack.enter_context(view.participant())
            yield

    def clear(self) -> None:
        """After a failure inside a model call: this lane's caches hold what their lists may not say."""
        for view in (self.verifier, self.draft):
            if view is not None:
                view.clear()


def draft_views(draft: Any, n_seq: int) -> list[Any]:
    """The draft's sequences; a hot-vocabulary draft (core/hot_vocab.py) keeps its maps over each."""
    if isinstance(draft, HotVocab):
        return [HotVocab(view, draft.ids, draft.feed, draft.rows) for view in draft_views(draft.model, n_seq)]
    return draft.sequences(n_seq)


class Lanes:
    def __init__(self, verifier: Any, draft: Any, n_seq: int):
        verifiers = verifier.sequences(n_seq)
        drafts = draft_views(draft, n_seq) if draft is not None else [None] * n_seq
        self.lanes = [Lane(index, view, drafts[index]) for index, view in enumerate(verifiers)]
        self._lock = threading.Lock()

    def acquire(self, prompt: list[int], *, fim: bool = False) -> Lane:
        """The free lane for `prompt` (one is free: a thread per lane asks), as the docstring above says;
        `fim`: a fill-in-the-middle request."""
        with self._lock:
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
                lane = max(going_on, key=lambda lane: (kept[lane.index], -lane.used))
            elif empty := [lane for lane in free if not lane.verifier.n_past]:
                lane = max(empty, key=lambda lane: -lane.used)
            else:
                lane = max(free, key=value)
            lane.busy, lane.prompt, lane.fim = True, list(prompt), fim
            return lane

    def release(self, lane: Lane) -> None:
        with self._lock:
            lane.busy, lane.used = False, time.monotonic()


def memory_available() -> int | None:
    """Bytes of memory available now (/proc/meminfo's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_parallel(bytes_per_sequence: int, available: int | None) -> int:
    """How many sequences `serve` keeps live without --parallel: as many as half the free memory holds,
    at least MIN_PARALLEL, at most MAX_AUTO_PARALLEL."""
    if available is None or bytes_per_sequence <= 0:
        return MIN_PARALLEL
    fits = int(available * MEMORY_SHARE) // bytes_per_sequence
    return max(MIN_PARALLEL, min(MAX_AUTO_PARALLEL, fits))
