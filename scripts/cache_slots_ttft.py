"""Two clients alternating chat turns vs one client alone: time to first token side by side.

Starts `specgguf serve` (with --cache-slots N), runs a conversation of T turns for one client
alone, then two clients alternating T turns each (a fresh server each time), and prints the median
time to first token from the second turn on, and the ratio (the aim: within 1.2x). Quiet machine:

    .venv/bin/python scripts/cache_slots_ttft.py [--pair NAME | -m V -md D] [--turns 5] [--cache-slots 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_server import live_server  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in two sentences."}
QUESTIONS = {
    "A": ["What is a hash table?", "And a binary tree?", "Which is faster to search?", "Why?", "Thanks. Summarise."],
    "B": ["How do tides work?", "Why two a day?", "What about the sun?", "Spring tides?", "Summarise, please."],
}


def ttft(client, messages, n: int) -> tuple[float, str]:
    start = time.perf_counter()
    first, parts = None, []
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=n, temperature=0, stream=True)
    for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            first = first or time.perf_counter() - start
            parts.append(text)
    return first or time.perf_counter() - start, "".join(parts)


def conversation(server, names: str, turns: int, n: int) -> list[float]:
    """Time to first token of every turn after each client's first."""
    client, histories, times = server.client(), {name: [SYSTEM] for name in names}, []
    for turn in range(turns):
        for name in names:
            histories[name].append({"role": "user", "content": QUESTIONS[name][turn % 5]})
            seconds, answer = ttft(client, histories[name], n)
            histories[name].append({"role": "assistant", "content": answer})
            if turn:
                times.append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", dest="model")
    parser.add_argument("-md", dest="draft")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("-n", type=int, default=48)
    parser.add_argument("--cache-slots", default="4")
    parser.add_argument("--serve-arg", action="append", default=[])
    args = parser.parse_args()
    models = (["--pair", args.pair] if args.pair else []) + (["-m", args.model] if args.model else [])
    models += ["-md", args.draft] if args.draft else []
    common = [*models, "--cache-slots", args.cache_slots, *args.serve_arg]
    results = {}
    for label, names in (("one client", "A"), ("two alternating", "AB")):
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(live_server(*common, startup_timeout=600))
            results[label] = statistics.median(conversation(server, names, args.turns, args.n))
    print(f"time to first token from the second turn, median, --cache-slots {args.cache_slots}")
    for label, seconds in results.items():
        print(f"{label:>16} {seconds * 1000:8.1f} ms")
    print(f"{'ratio':>16} {results['two alternating'] / results['one client']:8.2f}x")


if __name__ == "__main__":
    main()
