"""Decoding speed on an idle machine and beside one busy process, side by side (issue: the 15x collapse).

For each setting (the default, i.e. threads following the load; all cores fixed with -t; one thread),
runs `specgguf run` on the default pair, idle and with one `while True: pass` process competing,
interleaved, and prints the median tokens/s and the slowdown. Run it on an otherwise quiet machine:

    .venv/bin/python scripts/busy_machine.py --repeats 3 -n 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPT = "Explain in two sentences why the sky is blue."


def settings(cores: int) -> dict[str, list[str]]:
    return {
        "default (threads follow the load)": [],
        f"-t {cores} (all cores, the old default)": ["-t", str(cores)],
        "-t 1": ["-t", "1"],
    }


def tokens_per_second(extra: list[str], n: int, k: str, env: dict) -> float:
    command = [sys.executable, "-m", "specgguf", "run", "--temp", "0", "-n", str(n), "-k", k, "--json", *extra, PROMPT]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout)["tokens_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=32, help="tokens per run")
    parser.add_argument("-k", default="0", help="K for specgguf run (0: plain decoding)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    runs: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for load in ("idle", "1 busy process"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "idle" else None
            try:
                for name, extra in settings(cores).items():
                    speed = tokens_per_second(extra, args.n, args.k, dict(os.environ))
                    runs.setdefault((name, load), []).append(speed)
                    print(f"repeat {repeat + 1}: {name:<36} {load:<15} {speed:6.2f} tok/s", file=sys.stderr)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    print(f"\nmedian tok/s of {args.repeats} interleaved repeats, -n {args.n} -k {args.k}, {cores} cores")
    print("| setting | idle | 1 busy process | slowdown | idle vs old default |")
    print("|---|---|---|---|---|")
    old_idle = statistics.median(runs[(list(settings(cores))[1], "idle")])
    for name in settings(cores):
        idle, loaded = (statistics.median(runs[(name, load)]) for load in ("idle", "1 busy process"))
        print(f"| {name} | {idle:.2f} | {loaded:.2f} | {idle / loaded:.2f}× | {idle / old_idle:.2f}× |")


if __name__ == "__main__":
    main()
