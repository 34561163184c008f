"""What a new user gets: `specgguf run` at its defaults (nothing stored by bench) vs plain decoding (-k 0).

For each prompt kind and temperature, runs both interleaved, each in a fresh config folder (so
nothing `bench` stored is used), and prints median tokens/s and their ratio. Quiet machine only:

    .venv/bin/python scripts/default_vs_plain.py --repeats 3 -n 128 [--pair NAME | -m V -md D]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "prose": "Explain why the sky is blue.",
    "edit": "Add type hints to this function and return the code only:\n\ndef parse_config(path):\n"
    "    config = {}\n    with open(path) as handle:\n        for line in handle:\n"
    "            line = line.strip()\n            if not line or line.startswith('#'):\n"
    "                continue\n            key, value = line.split('=', 1)\n"
    "            config[key.strip()] = value.strip()\n    return config\n",
    "chat": "What are three good habits for staying focused while working from home?",
}


def run(models: list[str], extra: list[str], prompt: str, n: int, temp: float, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as config:
        command = [
            sys.executable,
            "-m",
            "specgguf",
            "run",
            *models,
            "-n",
            str(n),
            "--temp",
            str(temp),
            "--seed",
            str(seed),
            "--json",
            *extra,
            prompt,
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=900, env={**os.environ, "XDG_CONFIG_HOME": config}
        )
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--temps", default="0,0.8")
    parser.add_argument("--prompts", default=",".join(PROMPTS))
    parser.add_argument("--pair")
    parser.add_argument("-m")
    parser.add_argument("-md")
    parser.add_argument("--extra", default="", help="extra options for the default side, e.g. '--drafter hybrid'")
    args = parser.parse_args()
    models = (
        (["--pair", args.pair] if args.pair else [])
        + (["-m", args.m] if args.m else [])
        + (["-md", args.md] if args.md else [])
    )
    temps = [float(t) for t in args.temps.split(",")]
    kinds = args.prompts.split(",")
    speeds: dict[tuple, list[float]] = {}
    for repeat in range(args.repeats):
        for kind in kinds:
            for temp in temps:
                for side, extra in (("plain", ["-k", "0"]), ("default", args.extra.split())):
                    report = run(models, extra, PROMPTS[kind], args.n, temp, seed=repeat)
                    speeds.setdefault((kind, temp, side), []).append(report["tokens_per_second"])
                    print(
                        f"repeat {repeat + 1} {kind:<6} T={temp:g} {side:<8} {report['tokens_per_second']:6.2f} tok/s"
                        f"  steps {report['n_steps']}, drafted {report['n_drafted']}, {report['k_source']}",
                        file=sys.stderr,
                    )
    print(f"\nmedian tok/s, {args.repeats} interleaved repeats, -n {args.n}, default side: run {args.extra}")
    print("| prompt | T | plain | default | default / plain | median of paired ratios |")
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        for temp in temps:
            plain, default = (statistics.median(speeds[(kind, temp, side)]) for side in ("plain", "default"))
            paired = statistics.median(
                d / p for p, d in zip(speeds[(kind, temp, "plain")], speeds[(kind, temp, "default")])
            )
            print(f"| {kind} | {temp:g} | {plain:.2f} | {default:.2f} | {default / plain:.2f}× | {paired:.2f}× |")


if __name__ == "__main__":
    main()
