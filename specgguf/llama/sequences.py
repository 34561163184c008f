"""The real `batcher.Decoder`: one `LlamaModel`'s context holding `n_seq` sequences (`serve --parallel N`).

The context is made with `n_seq_max = N` and a KV cache per sequence (`kv_unified` off: llama.cpp
gives each sequence a stream of n_ctx cells of its own). That keeps each sequence's answer the same
as the request alone: its cells stay in its own order, as in a context of its own, where one cache
for all puts one sequence's new token into a hole another's rollback left (tree.py says why the
cell order changes the logits; CI caught a greedy answer that flipped at a near-tie that way).

llama.cpp passes only equal rows per sequence, of consecutive sequence ids, together, so the
decoder puts each batch in sequence order (four sequences of 4 rows in the order they came took
496 ms, in order 297, Q4 here) and, where they cost less than the passes they save, adds filler
rows that make a batch of unequal requests one pass (`fillers`, below: pure Python, tested without
llama.cpp).

`kv_bytes_per_token` times n_ctx is what one more live sequence costs (`LlamaModel.kv_bytes_per_sequence`):
its KV cache, keys and values of every layer, F16, from the model's sizes.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import llama_cpp
import numpy as np

from .batcher import WAIT_SECONDS, Batcher, Rows, SequenceView
from .stops import Stop

# Rows of the passes `LlamaDecoder.calibrate` times: the sizes of a round's passes, 1 to 4 lanes drafting a few.
CALIBRATION_ROWS = (1, 4, 8, 16)


class DecodeContext(Protocol):
    """What LlamaDecoder decodes with: a model's context of several sequences (model.LlamaModel)."""

    n_batch: int
    n_ctx: int
    n_embd: int
    batch: Any  # the llama_batch a decode of tokens fills

    def decode_batch(self, batch: Any, stop: Stop | None = None) -> None: ...
    def read_logits(self, n_logits: int, started: float) -> np.ndarray: ...
    def sequence_end(self, seq: int) -> int: ...
    def drop_cells(self, seq: int, start: int) -> None: ...
    def follow_load(self) -> None: ...


class LlamaDecoder:
    """Decodes several callers' rows in one llama_batch of a shared context (tokens and embedding rows apart)."""

    def __init__(self, model: DecodeContext):
        self.model = model
        self.n_batch = model.n_batch
        self._embd_batch: Any = None
        self.costs = PassCosts()

    def decode(self, work: Sequence[Rows]) -> list[np.ndarray]:
        results: dict[int, np.ndarray] = {}
        for embedded in (False, True):
            group = [(index, rows) for index, rows in enumerate(work) if (rows.embeddings is not None) == embedded]
            if group:
                results.update(self._decode_group(group, embedded))
        return [results[index] for index in range(len(work))]

    def _decode_group(self, group: list[tuple[int, Rows]], embedded: bool) -> dict[int, np.ndarray]:
        """One llama_batch of the group's rows, in sequence order (llama.cpp passes consecutive
        sequence ids together), with filler rows where they make it one pass (`fillers`, below)."""
        model = self.model
        batch = self._embedding_batch() if embedded else model.batch
        group = sorted(group, key=lambda item: item[1].seq)
        sizes: dict[int, int] = {}  # rows per sequence
        for _, rows in group:
            sizes[rows.seq] = sizes.get(rows.seq, 0) + len(rows.tokens)
        ends = {rows.seq: rows.start + len(rows.tokens) for _, rows in group}  # where a filler row would go
        unique = len(sizes) == len(group)  # (a sequence twice in one batch takes no fillers)
        extra = self._fillers(sizes, ends) if unique and not embedded else {}
        slot = 0

        def put(seq: int, pos: int, token: int, output: bool) -> None:
            nonlocal slot
            if not embedded:  # an embedding batch has no token array
                batch.token[slot] = token
            batch.pos[slot], batch.n_seq_id[slot], batch.seq_id[slot][0], batch.logits[slot] = pos, 1, seq, output
            slot += 1

        # An idle sequence between live ones: filler rows only.
        idle: list[tuple[int, Rows | None]] = [(seq, None) for seq in extra.keys() - sizes.keys()]
        for seq, own in sorted([*((rows.seq, rows) for _, rows in group), *idle], key=lambda entry: entry[0]):
            if own is not None:
                first_output = len(own.tokens) - own.n_logits
                if own.embeddings is not None:
                    address = ctypes.cast(batch.embd, ctypes.c_void_p).value or 0
                    ctypes.memmove(address + slot * model.n_embd * 4, own.embeddings.ctypes.data, own.embeddings.nbytes)
                for i, token in enumerate(own.tokens):
                    put(seq, own.start + i, token, i >= first_output)
            for i in range(extra.get(seq, 0)):  # after the sequence's own rows: none of them sees these
                put(seq, ends[seq] + i, 0, False)
        batch.n_tokens = slot
        n_outputs = sum(rows.n_logits for _, rows in group)
        started = time.perf_counter()
        # A prompt's chunk alone in its pass: llama.cpp abandons it once its request stops (stops.py).
        stop = group[0][1].stop if len(group) == 1 and not extra else None
        elapsed = self._timed_decode(batch, cells=[(seq, ends[seq]) for seq in extra], stop=stop)
        n_passes = len(passes({seq: sizes.get(seq, 0) + extra.get(seq, 0) for seq in sizes.keys() | extra.keys()}))
        self.costs.observe(slot, elapsed, n_passes)
        logits = model.read_logits(n_outputs, started)  # the outputs in batch order, as llama.cpp sorts them back
        out, offset = {}, 0
        for index, rows in group:
            out[index] = logits[offset : offset + rows.n_logits]
            offset += rows.n_logits
        return out

    def calibrate(self, rows: Sequence[int] = CALIBRATION_ROWS, repeats: int = 2) -> None:
        """Teach `costs` the pass line before the first request (serve --parallel): passes of `rows`
        rows of sequence 0, `repeats` times each after one unrecorded warm-up pass, the cells removed
        after each. Learned only from requests, a fresh server's first rounds had no line to price
        them by (rounds.round_k) and drafted up to K_MAX per lane, four lanes at once."""
        model, batch = self.model, self.model.batch
        sizes = [max(1, min(n, self.n_batch, model.n_ctx)) for n in rows]
        for index, n in enumerate([sizes[0], *sizes * repeats]):
            for i in range(n):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = 0, i, 1, 0
                batch.logits[i] = i == n - 1  # a real pass reads some logits
            batch.n_tokens = n
            elapsed = self._timed_decode(batch, cells=[(0, 0)])
            if index:
                self.costs.observe(n, elapsed)

    def _timed_decode(self, batch: Any, *, cells: list[tuple[int, int]], stop: Stop | None = None) -> float:
        """Seconds one llama_decode of `batch` took; afterwards, even if it failed, the `cells` (sequence,
        first position) are removed: rows no caller owns (fillers, a calibration's). `stop`: abortable."""
        self.model.follow_load()
        started = time.perf_counter()
        try:
            self.model.decode_batch(batch, stop)
            return time.perf_counter() - started
        finally:
            for seq, start in cells:
                self.remove(seq, start)

    def _fillers(self, sizes: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
        """Filler rows per sequence for a batch of `sizes` rows per sequence (`fillers`, below). `ends` gains
        the next position of each idle sequence that gets some."""

        def room(seq: int) -> int:
            if seq not in ends:
                ends[seq] = self._next_position(seq)
            return self.model.n_ctx - ends[seq]

        extra = fillers(sizes, room=room, n_batch=self.n_batch, line=self.costs.line())
        for seq in extra.keys() - ends.keys():  # (fillers asks room of each it fills; this keeps it so)
            ends[seq] = self._next_position(seq)
        return extra

    def _next_position(self, seq: int) -> int:
        """The position after sequence seq's last cell (0 for an empty one)."""
        return self.model.sequence_end(seq)

    def _embedding_batch(self) -> Any:
        if self._embd_batch is None:
            self._embd_batch = llama_cpp.llama_batch_init(self.n_batch, self.model.n_embd, 1)
        return self._embd_batch

    def pass_line(self) -> tuple[float, float] | None:
        return self.costs.line()

    def remove(self, seq: int, start: int) -> None:
        self.model.drop_cells(seq, start)

    def close(self) -> None:
        if self._embd_batch is not None:
            llama_cpp.llama_batch_free(self._embd_batch)
            self._embd_batch = None


class PassCosts:
    """What a pass costs, learned from the decodes run: seconds = a + b·rows, least squares over the
    recent ones (`line`); a decode llama.cpp cut into n passes (fillers.passes) counts n·a. A lane's
    K policy prices its steps by it (serve/parallel/, rounds.round_k), and the decoder its filler
    rows (`fillers`, below): a, the weights read once per pass, is shared by the requests in it; b, each
    row's compute, is not.

    Only decodes of a round's size (at most MAX_ROWS rows) are fitted: a prompt's pass of hundreds
    of rows would weigh on the fit most (least squares gives the longest decode the most leverage),
    and one run while another program held a core (llama/threads.py: one thread, twice the time)
    bent the line until the next refit failed, leaving the next rounds unpriced (K 16 per lane).
    A refit that fails keeps the line before it."""

    WINDOW, MIN_SEEN = 64, 8
    MAX_ROWS = 64  # a round's passes: four lanes drafting up to 15 each

    def __init__(self) -> None:
        self.seen: deque[tuple[int, int, float]] = deque(maxlen=self.WINDOW)  # (passes, rows, seconds)
        self._line: tuple[float, float] | None = None  # fitted since the last pass (every lane asks every step)
        self._fitted = False

    def observe(self, n_rows: int, seconds: float, n_passes: int = 1) -> None:
        if n_rows <= self.MAX_ROWS:
            self.seen.append((n_passes, n_rows, seconds))
            self._fitted = False

    def line(self) -> tuple[float, float] | None:
        """(a, b) in seconds, once enough decodes that tell a from b are measured and both come out
        positive (after that, the last such fit)."""
        if not self._fitted:
            self._line, self._fitted = self._fit() or self._line, True
        return self._line

    def _fit(self) -> tuple[float, float] | None:
        seen = list(self.seen)
        if len(seen) < self.MIN_SEEN:
            return None
        design = np.array([[float(passes), float(rows)] for passes, rows, _ in seen])
        seconds = np.array([t for *_, t in seen])
        (a, b), _, rank, _ = np.linalg.lstsq(design, seconds, rcond=None)
        return (float(a), float(b)) if rank == 2 and a > 0 and b > 0 else None


def sequence_views(
    model: Any, decoder: LlamaDecoder, wait_seconds: float = WAIT_SECONDS, *, calibrate: bool = False
) -> list[SequenceView]:
    """A view per sequence of the model's context (model.LlamaModel.sequences), decoded by `decoder`
    over one batcher (which waits `wait_seconds` for the other participants); the context starts
    empty. `calibrate`: its pass costs measured first (`LlamaDecoder.calibrate`)."""
    model.clear()
    if calibrate:
        decoder.calibrate()
    batcher = Batcher(decoder, wait_seconds=wait_seconds)
    return [
        SequenceView(batcher, seq, n_ctx=model.n_ctx, n_vocab=model.n_vocab, is_eog=model.is_eog)
        for seq in range(model.n_seq)
    ]


def kv_bytes_per_token(model: Any) -> int:
    """Keys and values of every layer for one token, F16 (llama.cpp's default cache type): the KV
    heads times the head sizes (the GGUF's key and value lengths where it gives them)."""
    n_layers = llama_cpp.llama_model_n_layer(model)
    n_head, n_head_kv = llama_cpp.llama_model_n_head(model), llama_cpp.llama_model_n_head_kv(model)
    head = llama_cpp.llama_model_n_embd(model) // max(1, n_head)
    architecture = _metadata(model, "general.architecture") or ""
    key = _metadata(model, f"{architecture}.attention.key_length")
    value = _metadata(model, f"{architecture}.attention.value_length")
    key_size = int(key) if key and key.isdigit() else head
    value_size = int(value) if value and value.isdigit() else head
    return n_layers * n_head_kv * (key_size + value_size) * 2


def _metadata(model: Any, key: str) -> str | None:
    buffer = ctypes.create_string_buffer(128)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode("utf-8", "replace") if size >= 0 else None


# Filler rows: one pass for a batch of several sequences, where llama.cpp would take several.
#
# With a KV cache per sequence (as here), llama.cpp cuts a batch into passes ("ubatches") that
# each hold the same number of rows for a run of consecutive sequence ids (llama_batch_allocr::
# split_equal, sequential): rows 4, 4, 1, 4 for sequences 0-3 go as 4x1, then 2x3 (sequences 0, 1),
# then 1x3 (sequence 3); sequences 0 and 2 without 1 go as two passes. Each pass reads all the
# weights again. Filler rows make the batch one pass: sequence 2 above gets 3 more rows, after its
# own, and a sequence between two others gets rows of its own, after what its cache holds; the
# causal mask keeps every real row from seeing them (they come later in their own sequence), no
# logits are read for them, and their cells are removed after the pass. They cost compute, so they
# are added only where one pass with them costs less than the passes without them, as the pass
# costs learned so far say (seconds = a + b * rows, `PassCosts`). Pure Python: the plan is tested
# without a model.
#
# Before the pass costs are learned: what one pass's fixed cost is worth in rows (a / b), a low
# guess (a compute-bound verifier, Q4 on a CPU, is about 1; a memory-bound one is far above).
GUESSED_ROWS_PER_PASS = 1.0


def passes(rows: Mapping[int, int]) -> list[int]:
    """The rows of each pass llama.cpp makes of a batch with `rows[seq]` rows per sequence (the
    batch in sequence order): each pass the longest run of consecutive sequence ids, from the
    lowest, that still have rows, with as many rows each as the fewest of them has left."""
    left = {seq: n for seq, n in rows.items() if n > 0}
    out = []
    while left:
        run = [min(left)]
        while run[-1] + 1 in left:
            run.append(run[-1] + 1)
        each = min(left[seq] for seq in run)
        out.append(each * len(run))
        for seq in run:
            left[seq] -= each
            if not left[seq]:
                del left[seq]
    return out


def fillers(
    rows: Mapping[int, int],
    *,
    room: Callable[[int], int],
    n_batch: int,
    line: tuple[float, float] | None,
) -> dict[int, int]:
    """Filler rows per sequence (0 for most) that make the batch one pass, or none at all where they
    do not pay: `room(seq)` is how many more cells sequence seq holds after its rows, `n_batch` the
    most rows a pass takes, `line` the learned pass costs (a, b) in seconds (None: not yet)."""
    live = [seq for seq, n in rows.items() if n > 0]
    split = passes(rows)
    if len(split) < 2:
        return {}
    width = max(rows[seq] for seq in live)
    span = range(min(live), max(live) + 1)
    extra = {seq: width - rows.get(seq, 0) for seq in span}
    if len(span) * width > n_batch or any(room(seq) < n for seq, n in extra.items() if n):
        return {}
    a, b = line if line is not None else (GUESSED_ROWS_PER_PASS, 1.0)
    one_pass = a + b * len(span) * width
    several = sum(a + b * n for n in split)
    return {seq: n for seq, n in extra.items() if n} if one_pass < several else {}
