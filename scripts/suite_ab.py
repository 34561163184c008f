"""The default against ablations of it, on the benchmark suite, in one process, timed (quiet machine only).

For each repeat and suite prompt, every variant answers once, in turn (odd repeats in reverse: ABBA),
through the same loaded pair: `default` (as `run` drafts: the hybrid, adaptive K, a new n-gram cache
per answer), `no-guesses` (the same, but the lookups a step did not draft teach the policy nothing:
drafting.Guess switched off, as before it existed), `plain` (-k 0). Prints the CPU and llama-bench's
verify curve first (when llama.cpp's programs are built), then per prompt the median tok/s and the
ratios, and the geometric means. Greedy by default:

    .venv/bin/python scripts/suite_ab.py -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgguf.bench import machine  # noqa: E402
from specgguf.bench.llama_tools import LlamaTools  # noqa: E402
from specgguf.bench.measure import generate  # noqa: E402
from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.engine import FixedK  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.errors import SpecggufError  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.kchoice import KChoice  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402


class NoGuesses:
    """A drafter whose unverified lookups are not scored (what the engine saw before drafting.Guess)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def guesses(self, context: list[int]) -> list:
        self._inner.guesses(context)  # forget the lookup, as scoring it would
        return []


def run(prepared, variant: str, tokens: list[int], *, temperature: float, n: int, seed: int):
    if variant == "plain":
        policy, drafter = FixedK(0), None
    else:
        kind = prepared.options.drafter
        policy, _ = prepared.policy(KChoice("adaptive"), temperature=temperature, drafter=kind)
        drafter = prepared.drafter(kind, session=SessionNgrams())
        if variant == "no-guesses":
            drafter = NoGuesses(drafter)
    return generate(prepared.verifier, drafter, tokens, policy=policy, max_tokens=n, temperature=temperature, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", type=Path)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-t", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--variants", default="default,no-guesses,plain")
    parser.add_argument("--prompts", help="comma-separated suite names (default: all)")
    parser.add_argument("--llama-bin", type=Path, default=Path("build/llama.cpp/bin"))
    args = parser.parse_args()
    try:
        tools = LlamaTools.find(args.llama_bin)
        print(machine.machine_lines(machine.machine_report(tools, [(args.m.name, args.m)], args.t)))
    except SpecggufError:  # llama.cpp's programs not built: the CPU alone
        here = machine.cpu()
        print(f"CPU: {here['cpu']}, avx512_vnni: {'yes' if here['avx512_vnni'] else 'no'} (no llama-bench)")
    pair = ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None)
    prepared = prepare(pair, LoadOptions(n_ctx=4096, n_threads=args.t), DraftOptions())
    variants = args.variants.split(",")
    chosen = set(args.prompts.split(",")) if args.prompts else None
    suite = [item for item in load_suite() if chosen is None or item.name in chosen]
    prompts = Prompts(prepared.verifier)
    tokens = {item.name: prompts.question(item.text, raw=False, system=None) for item in suite}
    speeds: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for item in suite:
            for variant in variants if repeat % 2 == 0 else variants[::-1]:
                stats = run(prepared, variant, tokens[item.name], temperature=args.temp, n=args.n, seed=repeat)
                speeds.setdefault((item.name, variant), []).append(stats.tokens_per_second)
            print(f"repeat {repeat + 1}: {item.name} done", file=sys.stderr, flush=True)
    base = variants[0]
    print(
        f"{'prompt':20} "
        + " ".join(f"{v:>11}" for v in variants)
        + "   "
        + " ".join(f"{base} ÷ {v}" for v in variants[1:])
    )
    ratios: dict[str, list[float]] = {v: [] for v in variants[1:]}
    for item in suite:
        medians = {v: statistics.median(speeds[(item.name, v)]) for v in variants}
        line = f"{item.name:20} " + " ".join(f"{medians[v]:11.2f}" for v in variants)
        for v in variants[1:]:
            ratios[v].append(medians[base] / medians[v])
            line += f"   {ratios[v][-1]:.3f}×"
        print(line)
    for v in variants[1:]:
        r = ratios[v]
        print(
            f"{base} ÷ {v}: geometric mean {float(np.exp(np.mean(np.log(r)))):.4f}×,"
            f" median {statistics.median(r):.3f}×, {min(r):.3f}–{max(r):.3f}×"
        )


if __name__ == "__main__":
    main()
