"""What the session n-gram cache gives the hybrid drafter when a request comes again (a regenerated
answer, an agent re-sending a task): answer 1 teaches a fresh cache, then answer 2 (another seed)
runs with that cache and without one, interleaved round by round. Quiet machine only:

    .venv/bin/python scripts/session_cache_gain.py --repeats 3 -n 128 --temp 0.8 \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.measure import PROMPTS  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.drafters import DraftSettings, build_drafter  # noqa: E402
from specgguf.core.engine import speculate  # noqa: E402
from specgguf.core.kpolicy import adaptive_policy  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.8)
    parser.add_argument("--prompts", default="code,edit,prose")
    args = parser.parse_args()
    prepared = prepare(
        ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None),
        LoadOptions(n_ctx=2048),
        DraftOptions(),
    )
    settings = SamplingSettings(temperature=args.temp)
    speeds: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for kind in args.prompts.split(","):
            tokens = Prompts(prepared.verifier).question(PROMPTS[kind], raw=False, system=None)
            session = SessionNgrams()
            for label, cache, seed in (
                ("answer 1", session, 100 + repeat),
                ("with", session, repeat),
                ("without", None, repeat),
            ):
                n_tokens, start, prefill = 0, time.perf_counter(), 0.0
                for event in speculate(
                    verifier=prepared.verifier,
                    drafter=build_drafter("hybrid", prepared.draft, DraftSettings(session=cache)),
                    prompt_tokens=tokens,
                    k=adaptive_policy("hybrid", prepared.costs),
                    max_tokens=args.n,
                    settings=settings,
                    rng=np.random.default_rng(seed),
                ):
                    n_tokens += len(event.tokens)
                    prefill += event.prefill_seconds
                speed = n_tokens / (time.perf_counter() - start - prefill)
                speeds.setdefault((kind, label), []).append(speed)
                print(f"round {repeat + 1} {kind:<6} {label:<9} {speed:6.2f} tok/s", file=sys.stderr)
    print(f"\nhybrid drafter, T={args.temp:g}, -n {args.n}, {args.repeats} rounds: median tok/s of answer 2")
    print("| prompt | without cache | with the cache answer 1 taught | median ratio |")
    print("|---|---|---|---|")
    for kind in args.prompts.split(","):
        with_, without = speeds[(kind, "with")], speeds[(kind, "without")]
        ratio = statistics.median(w / o for w, o in zip(with_, without))
        print(f"| {kind} | {statistics.median(without):.2f} | {statistics.median(with_):.2f} | {ratio:.2f}× |")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
