"""What `serve --deterministic` costs: total tok/s of N clients at once with and without it, and a chat's
follow-up turn (its prompt cache is not kept under --deterministic).

For each repeat, each mode in turn (interleaved: a machine's drift falls on both), on a fresh server
(`--parallel N`): N chat questions at once (serve_concurrency.throughput), then one conversation's
second turn, timed from the request to the whole answer. Prints the medians side by side, and
checks that the greedy answers agree under --deterministic across the repeats. Quiet machine only
(the lead runs it); `--smoke` is a short check that it runs:

    .venv/bin/python scripts/deterministic_cost.py [--pair NAME | -m V -md D] [--clients 3] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serve_concurrency import QUESTIONS, throughput  # noqa: E402

from live_server import live_server  # noqa: E402

MODES = {"shared passes": [], "--deterministic": ["--deterministic"]}
FOLLOW_UP = "Now add type hints to it."


def follow_up(server, n: int) -> tuple[float, str]:
    """Seconds of a conversation's second turn (its first answered just before), and the answer."""
    client = server.client()
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=n, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
    messages += [{"role": "user", "content": FOLLOW_UP}]
    start = time.perf_counter()
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=n, temperature=0)
    return time.perf_counter() - start, second.choices[0].message.content or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", dest="model")
    parser.add_argument("-md", dest="draft")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128, help="tokens per answer")
    parser.add_argument("--smoke", action="store_true", help="one short repeat: does it run?")
    parser.add_argument("--serve-args", default="", help="more options for `specgguf serve` (e.g. '-k 4')")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.n, args.clients = 1, 8, 2
    models = ["--pair", args.pair] if args.pair else ["-m", args.model] + (["-md", args.draft] if args.draft else [])
    models += args.serve_args.split() + ["--parallel", str(args.clients)]
    totals: dict[str, list[float]] = {mode: [] for mode in MODES}
    slowest: dict[str, list[float]] = {mode: [] for mode in MODES}
    turns: dict[str, list[float]] = {mode: [] for mode in MODES}
    answers: set[str] = set()
    for _ in range(args.repeats):
        for mode, extra in MODES.items():
            with live_server(*models, *extra, startup_timeout=600) as server:
                total, worst = throughput(server, args.clients, args.n, together=True)
            with live_server(*models, *extra, startup_timeout=600) as server:
                seconds, answer = follow_up(server, args.n)
            totals[mode].append(total)
            slowest[mode].append(worst)
            turns[mode].append(seconds)
            if extra:
                answers.add(answer)
    for mode in MODES:
        print(
            f"{mode:>16}: {args.clients} clients at once {statistics.median(totals[mode]):.1f} tok/s in total,"
            f" the slowest {statistics.median(slowest[mode]):.1f} tok/s; a follow-up turn"
            f" {statistics.median(turns[mode]):.2f} s (medians of {args.repeats})"
        )
    print(f"--deterministic follow-up answers: {len(answers)} distinct over {args.repeats} servers")


if __name__ == "__main__":
    main()
