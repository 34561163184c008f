"""What a step costs on this machine: the verifier's batch costs and the draft's token cost.

Adaptive K weighs the tokens a draft may win against what drafting and verifying
cost, so it needs those costs before the first step: learning them by drafting
loses time exactly where speculation does not pay. `tuning.probe` measures them
once per machine, model file and settings (a few seconds, announced) with `measure`
and keeps them in tuning.json; `bench` measures a longer, repeated table that replaces it.

On a CPU the verify cost is not a straight line in the batch size: llama.cpp
picks kernels by batch shape (one token goes through matrix-vector kernels, the
repacked Q4_K matrix-matrix kernels take rows four at a time), so the table is
kept as measured. docs/adaptive-k.md has tables measured on one machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from .model import Model

PROBE_BATCH = 6  # the probe times batches of 1..6 tokens (K up to 5); the policy extends the table past that
PROBE_CONTEXT = 32


@dataclass(frozen=True)
class MachineCosts:
    verify: tuple[float, ...]  # seconds to verify a batch of 1, 2, … tokens
    draft: float = 0.0  # seconds per token the draft model proposes (0.0: no draft model)

    def __post_init__(self) -> None:
        if len(self.verify) < 2:
            raise ValueError("a verify-cost table needs at least two batch sizes")


def measure(
    model: Model,
    *,
    max_batch: int,
    repeats: int = 3,
    context: int = 256,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> list[float]:
    """Seconds to evaluate a batch of n = 1..max_batch tokens (index n − 1) with logits for
    every row, as a verify step asks, after `context` tokens already in the cache.

    The median (or `statistic`) over `repeats` rounds; each round runs every size once, so a
    change of machine load hits all sizes alike. Token ids are arbitrary (the cost does not depend
    on them). The KV cache is left empty.
    """
    context = max(1, min(context, model.n_ctx - max_batch))
    filler = [(17 + 31 * i) % model.n_vocab for i in range(context + max_batch)]
    model.rewind(0)
    model.eval(filler[:context], n_logits=1)
    batch = filler[context:]
    model.eval(batch, n_logits=max_batch)  # warm-up: first-use allocations, caches
    model.rewind(context)
    timings: list[list[float]] = [[] for _ in range(max_batch)]
    for _ in range(repeats):
        for n in range(1, max_batch + 1):
            started = time.perf_counter()
            model.eval(batch[:n], n_logits=n)
            timings[n - 1].append(time.perf_counter() - started)
            model.rewind(context)
    model.rewind(0)
    return [statistic(t) for t in timings]


def describe(costs: list[float]) -> str:
    """One line for people: 'verify ms by batch size: 1: 37 · 2: 61 · …'."""
    return "verify ms by batch size: " + " · ".join(f"{n}: {c * 1000:.0f}" for n, c in enumerate(costs, 1))
