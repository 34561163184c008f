"""What verifying a batch of n tokens costs on this machine, measured once per verifier.

Adaptive K weighs the tokens a draft may win against what its verify batch costs.
On a CPU that cost is not a straight line in the batch size: llama.cpp picks
kernels by batch shape (one token goes through matrix-vector kernels; the
repacked Q4_K matrix-matrix kernels take rows four at a time, and other tensors
switch paths at other sizes). Measured here (2 cores, AVX-512, llama.cpp from
llama-cpp-python 0.3.36), Qwen2.5-Coder 1.5B Q4_K_M, milliseconds per batch:

    n     1   2   3   4    5    6    7    8    12   16   17
    ms   37  61  79  96  118  140  165  230  286  279  328

A batch of 16 costs less than one of 12, and 8 jumps by 65 ms over 7: a line
fitted through the small batches that adaptive K would otherwise see predicts
353 ms for 16 and keeps drafts short. `bench` measures this table (`measure`) and
stores it per machine, verifier file and thread count (tuning.json); `run` and
`chat` hand it to adaptive K, which scales it by what the steps it runs measure.
"""

from __future__ import annotations

import statistics
import time

from .engine import Model
from .tuning import store_verify_costs, stored_verify_costs, verify_costs_key


def measure(model: Model, *, max_batch: int, repeats: int = 3, context: int = 256) -> list[float]:
    """Seconds to evaluate a batch of n = 1..max_batch tokens (index n − 1) with logits for
    every row, as a verify step asks, after `context` tokens already in the cache.

    The median over `repeats` rounds; each round runs every size once, so a change of
    machine load hits all sizes alike. Token ids are arbitrary (the cost does not depend
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
    return [statistics.median(t) for t in timings]


def key_for(model) -> str:
    key = verify_costs_key(model.path, n_threads=model.n_threads, n_gpu_layers=model.n_gpu_layers)
    workers = getattr(getattr(model, "placement", None), "workers", ())
    return key + (f"|rpc={','.join(workers)}" if workers else "")  # costs over a network are its own


def stored(model) -> list[float] | None:
    """The table `bench` stored for this verifier file and settings on this machine, if any."""
    return stored_verify_costs(key_for(model))


def measure_and_store(model, *, max_batch: int, store: bool, **options) -> list[float]:
    costs = measure(model, max_batch=max_batch, **options)
    if store:
        store_verify_costs(key_for(model), costs)
    return costs


def describe(costs: list[float]) -> str:
    """One line for people: 'verify ms by batch size: 1: 37 · 2: 61 · …'."""
    return "verify ms by batch size: " + " · ".join(f"{n}: {c * 1000:.0f}" for n, c in enumerate(costs, 1))
