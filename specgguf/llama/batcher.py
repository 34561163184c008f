"""Several sequences in one context, decoded together: the `Batcher` and each request's `SequenceView`.

`serve --parallel N` gives each live request its own KV sequence of the verifier and of the draft
(llama/sequences.py makes them over one llama.cpp context per model). A view is the engine's `Model`
for one sequence: its own `cached` tokens, its own positions, a `rewind` that removes its own cells
only. Its `eval` does not decode: it hands its rows (`Rows`: sequence id, first position, tokens,
how many logits rows) to the context's `Batcher`, which decodes as soon as every registered
participant (a live request's thread) is waiting in a call, or after `wait_seconds` (a thread busy
in Python, or drafting, does not stall the others): all their rows in one batch, each with its own
sequence id and positions, so the causal mask stays per sequence, and each caller gets its own
logits rows back. The engine's loop is unchanged and, per sequence, exact.

Nothing here imports llama_cpp: the decoder is a protocol (sequences.py is the real one; the tests
plant fakes, and a wrong batcher that mixes rows across sequences, which the laws refuse).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ContextFullError
from . import stops
from .stops import Stop

WAIT_SECONDS = 0.002  # how long a call waits for the other participants before decoding without them
# A long evaluation among other live requests goes in chunks of about this long (SequenceView._chunk_rows).
SHARED_CHUNK_SECONDS, MIN_SHARED_CHUNK = 0.5, 16


@dataclass(eq=False)
class Rows:
    """One caller's part of a batch: `tokens` at positions start, start + 1, ... of sequence `seq`;
    logits for the last `n_logits` (`embeddings`: each position read as this row instead of its token's)."""

    seq: int
    start: int
    tokens: list[int]
    n_logits: int
    embeddings: np.ndarray | None = None
    seconds: float = 0.0  # set by the batcher: this caller's share of its batch's time, by rows
    stop: Stop | None = None  # a prompt's chunk: its request's stop, for a pass that is its alone (stops.py)
    alone: bool = False  # decoded in a pass of its own, never beside another caller's rows (serve --deterministic)


class Decoder(Protocol):
    """What a batcher decodes with: one context holding several sequences."""

    n_batch: int  # the most rows one decode takes

    def decode(self, work: Sequence[Rows]) -> list[np.ndarray]:
        """Decode every caller's rows (one batch, or one per kind of input); each caller's logits rows, in order."""

    def remove(self, seq: int, start: int) -> None:
        """Drop sequence `seq`'s cells from position `start` on."""

    def pass_line(self) -> tuple[float, float] | None:
        """What a pass costs, (per pass, per row) seconds, as learned from the decodes run
        (sequences.PassCosts; None before it has, or for a decoder that does not learn it)."""


@dataclass(eq=False)
class _Call:
    rows: Rows
    result: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class Batcher:
    """Gathers the rows of the threads that share a context and decodes them together."""

    def __init__(self, decoder: Decoder, *, wait_seconds: float = WAIT_SECONDS):
        self.decoder, self.wait_seconds = decoder, wait_seconds
        self._changed = threading.Condition(threading.Lock())
        self._pending: list[_Call] = []
        self._participants = 0
        self._decoding = False
        self.n_decodes = 0  # batches decoded (a metric: rows per batch = n_rows / n_decodes)
        self.n_rows = 0

    @property
    def n_participants(self) -> int:
        """The threads taking part now (the live requests)."""
        return self._participants

    @contextlib.contextmanager
    def participant(self) -> Iterator[None]:
        """While a request's thread is live: a batch waits for it (up to `wait_seconds`)."""
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """(A participant's thread, between its calls.) While it waits outside: batches no longer
        wait for it (serve/parallel/lanes.py: a request giving way to an editor's completion)."""
        self._count(-1)
        try:
            yield
        finally:
            self._count(+1)

    def _count(self, change: int) -> None:
        with self._changed:
            self._participants += change
            if change < 0:
                self._changed.notify_all()  # the others may all be waiting now

    def run(self, rows: Rows) -> np.ndarray:
        """Decode `rows` with whatever the other participants bring; its logits rows."""
        call = _Call(rows)
        with self._changed:
            self._pending.append(call)
            self._changed.notify_all()
            deadline = time.monotonic() + self.wait_seconds
            while not call.done:
                now = time.monotonic()
                taken = [] if self._decoding else self._next_batch(late=now >= deadline)
                if taken:
                    self._lead(taken)
                elif self._decoding or now >= deadline:
                    self._changed.wait()  # the decode under way ends with notify_all
                else:
                    self._changed.wait(deadline - now)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _next_batch(self, *, late: bool) -> list[_Call]:
        """(Holding the lock.) The calls to decode now, if any: the shared calls that fit one batch,
        in arrival order, once every participant has brought its rows (or the caller waited
        `wait_seconds`: `late`); a call `alone` goes in a pass of its own at once, and never waits
        for the others (its thread is no participant: serve/parallel/lanes.py)."""
        shared = [call for call in self._pending if not call.rows.alone]
        alone = [call for call in self._pending if call.rows.alone]
        ready = bool(shared) and (late or len(shared) >= max(1, self._participants))
        if alone and not (ready and self._pending[0] is shared[0]):
            return alone[:1]
        if not ready:
            return []
        taken: list[_Call] = []
        n_rows = 0
        for call in shared:
            if taken and n_rows + len(call.rows.tokens) > self.decoder.n_batch:
                continue
            taken.append(call)
            n_rows += len(call.rows.tokens)
        return taken

    def _lead(self, taken: list[_Call]) -> None:
        """(Holding the lock.) Decode `taken` in one batch."""
        n_rows = sum(len(call.rows.tokens) for call in taken)
        self._pending = [call for call in self._pending if call not in taken]
        self._decoding = True
        self._changed.release()
        started = time.perf_counter()
        try:
            results: list[np.ndarray] | None = self.decoder.decode([call.rows for call in taken])
            error: BaseException | None = None
        except BaseException as failure:  # noqa: BLE001 - every caller of this batch hears it
            results, error = None, failure
        finally:
            elapsed = time.perf_counter() - started
            self._changed.acquire()
        for call in taken:  # each pays for its own rows: the batch's fixed cost is shared
            call.rows.seconds = elapsed * len(call.rows.tokens) / max(1, n_rows)
        self._decoding = False
        self.n_decodes, self.n_rows = self.n_decodes + 1, self.n_rows + n_rows
        for index, call in enumerate(taken):
            call.result, call.error, call.done = (None if results is None else results[index]), error, True
        self._changed.notify_all()

    def exclusive(self, action: Callable[[], Any]) -> Any:
        """Run `action` (a cache edit) while no batch is being decoded."""
        with self._changed:
            while self._decoding:
                self._changed.wait()
            return action()


class SequenceView:
    """One request's sequence in a shared context: the engine's `Model` (chains only: `max_leaves` 1)."""

    max_leaves = 1  # draft trees need sequences of their own: off under --parallel > 1

    def __init__(self, batcher: Batcher, seq: int, *, n_ctx: int, n_vocab: int, is_eog: Callable[[int], bool]):
        self.batcher, self.seq = batcher, seq
        self.n_ctx, self.n_vocab, self.is_eog = n_ctx, n_vocab, is_eog
        self.cached: list[int] = []
        self.busy_seconds = 0.0  # time in this view's batches (shared with the others in them)
        self.charged_seconds = 0.0  # ... of which its share, by rows: what its steps cost (serve/parallel/)
        self._pending_base: int | None = None  # a chain evaluated by eval_tree, until keep_path
        # The same request's sequences of the other model (serve/parallel/lanes.py): while this one reads a
        # long evaluation, their batches do not wait for this thread's rows (it brings none).
        self.partners: list[SequenceView] = []
        # Its request's rows go in passes of their own (serve --deterministic): it is then no participant,
        # so no batch waits for it, and its long evaluations go in whole batches, whoever else is live.
        self.alone = False

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def participant(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.alone else self.batcher.participant()

    def away(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.alone else self.batcher.away()

    def pass_line(self) -> tuple[float, float] | None:
        """What a pass of this context costs, (per pass, per row) seconds (Decoder.pass_line)."""
        return self.batcher.decoder.pass_line()

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        return self._append(list(tokens), n_logits, None)

    def eval_embeddings(self, tokens: Sequence[int], rows: np.ndarray, *, n_logits: int) -> np.ndarray:
        return self._append(list(tokens), n_logits, np.ascontiguousarray(rows, dtype=np.float32))

    def _append(self, tokens: list[int], n_logits: int, embeddings: np.ndarray | None) -> np.ndarray:
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context overflow: {self.n_past} + {len(tokens)} tokens > {self.n_ctx}")
        n_batch = self.batcher.decoder.n_batch
        if not 0 <= n_logits <= min(len(tokens), n_batch):
            raise ValueError(f"asked for {n_logits} logits rows from {len(tokens)} tokens")
        with contextlib.ExitStack() as elsewhere:
            if len(tokens) > MIN_SHARED_CHUNK:  # a prompt, a draft catching up: passes of many rows
                for partner in self.partners:
                    elsewhere.enter_context(partner.away())
            return self._chunks(tokens, n_logits, embeddings)

    def _chunks(self, tokens: list[int], n_logits: int, embeddings: np.ndarray | None) -> np.ndarray:
        """`tokens` through the batcher in chunks (`_chunk_rows`), each a call of its own."""
        first_output, parts, start = len(tokens) - n_logits, [], 0
        while start < len(tokens):
            stops.check_stop()  # a request whose client has gone stops here, its chunks so far cached
            end = min(start + self._chunk_rows(), len(tokens))
            rows = Rows(
                self.seq,
                self.n_past,
                tokens[start:end],
                max(0, end - max(start, first_output)),
                None if embeddings is None else embeddings[start:end],
                stop=stops.current() if end - start >= stops.ABORTABLE_ROWS else None,
                alone=self.alone,
            )
            started = time.perf_counter()
            parts.append(self.batcher.run(rows))
            self.busy_seconds += time.perf_counter() - started
            self.charged_seconds += rows.seconds
            self.cached.extend(rows.tokens)
            start = end
        if len(parts) == 1:
            return parts[0]  # (most calls: one batch's rows, not copied again)
        return np.concatenate(parts) if parts else np.empty((0, self.n_vocab), dtype=np.float32)

    def _chunk_rows(self) -> int:
        """Rows for the next chunk of a long evaluation (a prompt, a draft catching up): a whole batch
        alone; with other requests live, about SHARED_CHUNK_SECONDS' worth by the pass line, so that
        their steps ride along with the prompt's chunks (the batcher takes both into one pass)
        instead of waiting out passes of hundreds of rows (512 rows: 13 s of the Q4 1.5B here)."""
        n_batch = self.batcher.decoder.n_batch
        line = self.pass_line()
        if self.alone or self.batcher.n_participants <= 1 or line is None:
            return n_batch
        per_pass, per_row = line
        return max(MIN_SHARED_CHUNK, min(n_batch, int((SHARED_CHUNK_SECONDS - per_pass) / per_row)))

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        """A chain only (`max_leaves` is 1): evaluated as `eval`, kept by `keep_path`."""
        if list(parents) != list(range(-1, len(tokens) - 1)):
            raise ValueError("draft trees are off for a sequence of a shared context (serve --parallel > 1)")
        base = self.n_past
        logits = self.eval(tokens, n_logits=n_logits)
        self._pending_base = base
        return logits

    def keep_path(self, path: Sequence[int]) -> None:
        base, self._pending_base = self._pending_base, None
        if base is None:
            raise ValueError("keep_path without a pending tree")
        if list(path) != list(range(len(path))):
            raise ValueError(f"{list(path)} is not a path from the root of the chain")
        self.rewind(base + len(path))

    def rewind(self, n_past: int) -> None:
        self._pending_base = None
        if n_past < self.n_past:
            self.batcher.exclusive(lambda: self.batcher.decoder.remove(self.seq, n_past))
            del self.cached[n_past:]

    def clear(self) -> None:
        """Empty this sequence (after a failure: the cells may hold what `cached` does not say)."""
        self._pending_base = None
        self.batcher.exclusive(lambda: self.batcher.decoder.remove(self.seq, 0))
        self.cached.clear()
