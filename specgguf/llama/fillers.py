"""Filler rows: one pass for a batch of several sequences, where llama.cpp would take several.

With a KV cache per sequence (sequences.py), llama.cpp cuts a batch into passes ("ubatches") that
each hold the same number of rows for a run of consecutive sequence ids (llama_batch_allocr::
split_equal, sequential): rows 4, 4, 1, 4 for sequences 0-3 go as 4x1, then 2x3 (sequences 0, 1),
then 1x3 (sequence 3); sequences 0 and 2 without 1 go as two passes. Each pass reads all the
weights again. Filler rows make the batch one pass: sequence 2 above gets 3 more rows, after its
own, and a sequence between two others gets rows of its own, after what its cache holds; the
causal mask keeps every real row from seeing them (they come later in their own sequence), no
logits are read for them, and their cells are removed after the pass. They cost compute, so they
are added only where one pass with them costs less than the passes without them, as the pass
costs learned so far say (seconds = a + b * rows, sequences.PassCosts).

Pure Python: the plan is tested without llama.cpp; sequences.LlamaDecoder carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
