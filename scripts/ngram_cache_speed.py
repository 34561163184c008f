"""How long the session n-gram cache (specgguf/ngram_cache.py) takes, beside the budget each use has.

lookup runs once per decoding step (budget: 1 ms for k <= 16 on ~100k n-grams); learn runs on each
step's new tokens and on whole prompts (budget: 50 ms for 4k tokens). The token stream is synthetic:
Zipf-distributed ids from a 150k vocabulary with earlier spans copied, as code and chat repeat
themselves. One process, one thread, no model. Wait while /tmp/specgguf-QUIET exists before running:

    .venv/bin/python scripts/ngram_cache_speed.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402  # after the sys.path line, to run from a checkout


def token_stream(n_tokens: int, *, seed: int, n_vocab: int = 150_000, copy_share: float = 0.3) -> list[int]:
    """Zipf-distributed tokens, with spans of 4-32 tokens copied from earlier in the stream."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        if len(tokens) > 64 and rng.random() < copy_share:
            length = int(rng.integers(4, 33))
            start = int(rng.integers(0, len(tokens) - length))
            tokens.extend(tokens[start : start + length])
        else:
            tokens.extend((rng.zipf(1.2, size=16) % n_vocab).tolist())
    return tokens[:n_tokens]


def timed(function, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def row(name: str, seconds: list[float], budget: float | None = None, extra: str = "") -> None:
    median = statistics.median(seconds)
    p99 = sorted(seconds)[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    ratio = f"{budget / median:8.0f}x under" if budget else " " * 14
    budget_text = f"{budget * 1e3:7.1f} ms" if budget else " " * 10
    print(f"{name:<44} {median * 1e6:11.1f} {p99 * 1e6:11.1f}   {budget_text}  {ratio}  {extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ngrams", type=int, default=100_000, help="size of the cache lookups run on")
    parser.add_argument("--repeats", type=int, default=2000, help="calls timed per lookup/step row")
    args = parser.parse_args()

    print(f"{'':<44} {'median µs':>11} {'p99 µs':>11}   {'budget':>10}  {'ratio':>14}")
    prompts = [token_stream(4096, seed=100 + i) for i in range(10)]
    row(
        "learn a 4k-token prompt, empty cache",
        [timed(lambda p=p: SessionNgrams().learn(p), 1)[0] for p in prompts],
        0.05,
    )

    history = token_stream(60_000, seed=1)
    cache = SessionNgrams()
    grown = 0
    while len(cache) < args.ngrams and grown < len(history):  # learn until the cache holds --ngrams n-grams
        cache.learn(history[: grown + 256], start=grown)
        grown += 256
    history = history[:grown]
    print(f"(cache: {len(cache)} n-grams from {grown} tokens, n = 2..4)")
    row("learn a 4k-token prompt, into that cache", [timed(lambda p=p: cache.learn(p), 1)[0] for p in prompts], 0.05)

    growing = list(history)
    step_seconds = []
    for step in range(args.repeats // 4):
        start = len(growing)
        growing.extend(prompts[step % len(prompts)][step % 4000 : step % 4000 + 4])
        step_seconds += timed(lambda start=start: cache.learn(growing, start=start), 1)
    row("learn one step's 4 new tokens", step_seconds)

    rng = np.random.default_rng(2)
    for label, contexts in [
        ("lookup k=16, context from the history", [history[: int(at)] for at in rng.integers(8, grown, 200)]),
        ("lookup k=16, unseen context (misses)", [[int(t) for t in rng.integers(0, 150_000, 8)] for _ in range(200)]),
    ]:
        drafted: list[int] = []
        seconds = []
        for i in range(args.repeats):
            context = contexts[i % len(contexts)]
            started = time.perf_counter()
            tokens, _ = cache.lookup(context, 16)
            seconds.append(time.perf_counter() - started)
            drafted.append(len(tokens))
        row(label, seconds, 0.001, f"{statistics.mean(drafted):.1f} tokens drafted on average")

    bounded = SessionNgrams(max_entries=len(cache) // 2)
    bounded.learn(history)  # full: each new n-gram now evicts the oldest
    row("learn a 4k-token prompt past max_entries", [timed(lambda p=p: bounded.learn(p), 1)[0] for p in prompts], 0.05)

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cache.npz"
        row("save the cache", timed(lambda: cache.save(path, key="pair"), 3))
        row("load the cache", timed(lambda: SessionNgrams.load(path, key="pair"), 3))
        size = path.stat().st_size

    tracemalloc.start()
    measured = SessionNgrams()
    measured.learn(history)
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_ngram = allocated / len(measured)
    print(f"memory: {per_ngram:.0f} bytes per n-gram in Python; file: {size / len(cache):.0f} bytes per n-gram")


if __name__ == "__main__":
    main()
