"""Block verification against the token rule (`--accept block|token`) on one pair, interleaved.

Both rules run through the same engine on the same prompts with the same seed, alternating within
each round (repeats), one pair loaded once. Prints, per prompt, temperature and K (a fixed K with
the draft model alone, as llama-speculative-simple drafts, or `auto`: the default hybrid drafter
and adaptive K), the median drafts kept per drafting step and tokens/s of each rule (tokens per
step in the per-run lines), and block's median gain over token on the same prompt and round. At
temperature 0 both rules are the greedy rule (the same tokens at a fixed K; adaptive K follows
measured timings, so there the steps may differ); the gain is at T > 0. Quiet machine only (docs/adaptive-k.md):

    .venv/bin/python scripts/accept_ab.py --repeats 3 -n 128 --temps 0.8 --ks 4,8,auto \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.measure import PROMPTS  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.drafters import DraftSettings, build_drafter  # noqa: E402
from specgguf.core.engine import speculate  # noqa: E402
from specgguf.core.kpolicy import PolicyConfig, adaptive_policy  # noqa: E402
from specgguf.core.sampling import Acceptance, SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.kchoice import KChoice  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402

RULES: tuple[Acceptance, ...] = ("token", "block")


def one_run(prepared, tokens: list[int], k: str, settings: SamplingSettings, n: int, seed: int) -> tuple:
    """(drafts kept per drafting step, tokens per step, tokens/s) of one answer."""
    auto = k == "auto"
    drafter = build_drafter("hybrid" if auto else "model", prepared.draft, DraftSettings())
    if auto:
        policy = adaptive_policy("hybrid", prepared.costs, PolicyConfig())
    else:  # as `run -k N` sets it up (its draft's reading as measured)
        policy = prepared.policy(KChoice("fixed", int(k)), temperature=settings.temperature, drafter="model")[0]
    kept, steps, n_tokens, prefill, start = [], 0, 0, 0.0, time.perf_counter()
    for event in speculate(
        verifier=prepared.verifier,
        drafter=drafter,
        prompt_tokens=tokens,
        k=policy,
        max_tokens=n,
        settings=settings,
        rng=np.random.default_rng(seed),
    ):
        steps, n_tokens, prefill = steps + 1, n_tokens + len(event.tokens), prefill + event.prefill_seconds
        if event.chain_drafted:
            kept.append(event.chain_accepted)
    seconds = time.perf_counter() - start - prefill
    return (statistics.fmean(kept) if kept else 0.0), n_tokens / max(steps, 1), n_tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--temps", default="0.8")
    parser.add_argument("--ks", default="4,8,auto")
    parser.add_argument("--prompts", default="code,prose,edit")
    args = parser.parse_args()
    temps, ks, kinds = [float(t) for t in args.temps.split(",")], args.ks.split(","), args.prompts.split(",")
    prepared = prepare(
        ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None),
        LoadOptions(n_ctx=2048),
        DraftOptions(),
    )
    tokens = {kind: Prompts(prepared.verifier).question(PROMPTS[kind], raw=False, system=None) for kind in kinds}
    runs: dict[tuple, list[tuple]] = {}
    for repeat in range(args.repeats):
        for kind in kinds:
            for temp in temps:
                for k in ks:
                    for rule in RULES if repeat % 2 == 0 else RULES[::-1]:
                        settings = replace(SamplingSettings(temperature=temp), acceptance=rule)
                        result = one_run(prepared, tokens[kind], k, settings, args.n, seed=repeat)
                        runs.setdefault((kind, temp, k, rule), []).append(result)
                        print(
                            f"round {repeat + 1} {kind:<6} T={temp:g} K={k:<4} {rule:<5} kept/step {result[0]:.2f}"
                            f" tokens/step {result[1]:.2f} {result[2]:6.2f} tok/s",
                            file=sys.stderr,
                        )
    print(
        f"\n{args.m.name} + {args.md.name}: medians over {args.repeats} interleaved rounds, -n {args.n};"
        " in brackets block's median ratio to token on the same prompt and round"
    )
    print("| prompt | T | K | kept/step token | kept/step block | tok/s token | tok/s block |")
    print("|---|---|---|---|---|---|---|")
    for kind in kinds:
        for temp in temps:
            for k in ks:
                token, block = runs[(kind, temp, k, "token")], runs[(kind, temp, k, "block")]
                speed_ratio = statistics.median(b[2] / t[2] for b, t in zip(block, token))
                kept_gain = statistics.median(b[0] - t[0] for b, t in zip(block, token))
                print(
                    f"| {kind} | {temp:g} | {k} | {statistics.median(t[0] for t in token):.2f}"
                    f" | {statistics.median(b[0] for b in block):.2f} ({kept_gain:+.2f})"
                    f" | {statistics.median(t[2] for t in token):.2f}"
                    f" | {statistics.median(b[2] for b in block):.2f} ({speed_ratio:.2f}×) |"
                )


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
