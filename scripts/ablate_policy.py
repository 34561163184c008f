"""Ablation of the adaptive K policy: the full policy against versions with one part taken out.

Each variant runs through the same engine on the same prompts, interleaved round by round
(repeats), with one pair loaded once; prints median tokens/s and each variant's median ratio
to the full policy on the same prompt and round. Quiet machine only (docs/adaptive-k.md):

    .venv/bin/python scripts/ablate_policy.py --repeats 3 -n 128 --temps 0,0.8 \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

Variants:
- full: the adaptive policy as shipped, with the draft model alone (`--drafter model`).
- no-calibration: the draft's top probability taken as its acceptance chance, not calibrated.
- no-look-ahead: `keep_drafting` asks only whether the next draft pays, not any later one.
- mean-ahead: `keep_drafting` expects drafts past the newest at the overall acceptance rate,
  not at the newest draft's calibrated rate (not kept: docs/adaptive-k.md).
- line-costs: the measured verify table replaced by a straight line fitted through it.
- tree: draft trees on (`--draft-tree`: the runner-up beside the chain where the costs say it pays).
- hybrid: `--drafter hybrid` (n-gram drafts on long matches, else the model), no session cache.
- hybrid-session: the same with a session n-gram cache that has learned the earlier prompts'
  answers in the same round and temperature (a new cache each round: never the prompt's own
  answer from an earlier round, which would repeat word for word).
- hybrid-mean-ahead: the hybrid with mean-ahead.
- plain: K = 0, for scale.

Issue 14's ablation: `--variants full,tree,hybrid,hybrid-session,plain --prompts code,prose,edit`
(it ran while trees were on by default, as `full,chain,...`; `full` is now the chain).
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
from specgguf.core.acceptance_counts import Calibration  # noqa: E402
from specgguf.core.costs import MachineCosts  # noqa: E402
from specgguf.core.drafters import DraftSettings, build_drafter  # noqa: E402
from specgguf.core.engine import FixedK, speculate  # noqa: E402
from specgguf.core.kpolicy import AdaptiveK, PerSource, PolicyConfig, adaptive_policy  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402


class RawConfidence(Calibration):
    def __call__(self, probability: float, optimism: float = 0.0, settled: float = 0.0) -> float:
        return probability


class NoLookAhead(AdaptiveK):
    def keep_drafting(self, confidences: list[float]) -> bool:
        n = len(confidences)
        if n >= self.config.k_max:
            return False
        acceptance = np.array([self.acceptance.calibrated(c) for c in confidences])
        all_accepted = np.cumprod(acceptance)
        expected_now = 1.0 + all_accepted.sum()
        expected_next = expected_now + all_accepted[-1] * acceptance[-1]
        now, after = self.costs.step(np.array([n, n + 1]))
        return bool(expected_next / after > expected_now / now)


class MeanAhead(AdaptiveK):
    """Drafts past the newest are each accepted at the measured overall rate, not at the
    newest draft's calibrated rate (no streaks assumed)."""

    def ahead(self, acceptance: np.ndarray) -> float:
        return self.acceptance.overall()


def line_costs(costs: MachineCosts) -> MachineCosts:
    """The table's batches of 2+ tokens replaced by their least-squares line (one token kept)."""
    sizes = np.arange(2, len(costs.verify) + 1)
    slope, intercept = np.polyfit(sizes, costs.verify[1:], 1)
    return MachineCosts((costs.verify[0], *(float(c) for c in intercept + slope * sizes)), draft=costs.draft)


def policy_for(variant: str, costs: MachineCosts):
    config = PolicyConfig()
    if variant == "plain":
        return FixedK(0)
    if variant == "line-costs":
        return AdaptiveK(line_costs(costs), config)
    if variant == "tree":
        return AdaptiveK(costs, PolicyConfig(trees=True))
    if variant == "hybrid-mean-ahead":
        return PerSource({source: MeanAhead(costs, config, source=source) for source in ("model", "ngram")})
    if variant.startswith("hybrid"):
        return adaptive_policy("hybrid", costs, config)
    kinds = {"no-look-ahead": NoLookAhead, "mean-ahead": MeanAhead}
    policy = kinds.get(variant, AdaptiveK)(costs, config)
    if variant == "no-calibration":
        policy.acceptance.calibrated = RawConfidence(config.calibration_decay)
    return policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--temps", default="0,0.8")
    parser.add_argument("--variants", default="full,no-calibration,no-look-ahead,line-costs,plain")
    parser.add_argument("--prompts", default="code,prose")
    args = parser.parse_args()
    variants, temps = args.variants.split(","), [float(t) for t in args.temps.split(",")]
    kinds = args.prompts.split(",")
    prepared = prepare(
        ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None),
        LoadOptions(n_ctx=2048),
        DraftOptions(),
    )
    print(
        f"costs: verify {[round(c * 1000) for c in prepared.costs.verify]} ms, draft "
        f"{prepared.costs.draft * 1000:.0f} ms/token",
        file=sys.stderr,
    )
    tokens = {kind: Prompts(prepared.verifier).question(PROMPTS[kind], raw=False, system=None) for kind in kinds}
    speeds: dict[tuple, list[float]] = {}
    for repeat in range(args.repeats):
        sessions = {temp: SessionNgrams() for temp in temps}  # what this round's earlier answers taught
        for kind in kinds:
            for temp in temps:
                for variant in variants:
                    drafter = build_drafter(
                        "hybrid" if variant.startswith("hybrid") else "model",
                        prepared.draft,
                        DraftSettings(session=sessions[temp] if variant == "hybrid-session" else None),
                    )
                    n_tokens, start, prefill = 0, time.perf_counter(), 0.0
                    for event in speculate(
                        verifier=prepared.verifier,
                        drafter=drafter,
                        prompt_tokens=tokens[kind],
                        k=policy_for(variant, prepared.costs),
                        max_tokens=args.n,
                        settings=SamplingSettings(temperature=temp),
                        rng=np.random.default_rng(repeat),
                    ):
                        n_tokens += len(event.tokens)
                        prefill += event.prefill_seconds
                    speed = n_tokens / (time.perf_counter() - start - prefill)
                    speeds.setdefault((kind, temp, variant), []).append(speed)
                    print(f"round {repeat + 1} {kind:<6} T={temp:g} {variant:<15} {speed:6.2f} tok/s", file=sys.stderr)
    print(
        f"\n{args.m.name} + {args.md.name}: median tok/s over {args.repeats} interleaved rounds, -n {args.n};"
        " in brackets the median ratio to `full` on the same prompt and round"
    )
    print("| prompt | T | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for kind in kinds:
        for temp in temps:
            full = speeds[(kind, temp, "full")]
            cells = []
            for variant in variants:
                runs = speeds[(kind, temp, variant)]
                ratio = statistics.median(v / f for v, f in zip(runs, full))
                cells.append(f"{statistics.median(runs):.2f}" + ("" if variant == "full" else f" ({ratio:.2f}×)"))
            print(f"| {kind} | {temp:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
