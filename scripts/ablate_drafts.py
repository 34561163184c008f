"""Which draft file wins here: the original vs each variant (drafts/made.py), interleaved, in one process.

For each repeat, prompt kind and temperature: plain decoding, then every draft at specgguf's
default settings (hybrid drafter, adaptive K from this machine's costs, a new n-gram cache per
run). Prints per draft: ms per draft token (measured, min of rounds), acceptance, tok/s (median)
and the median ratio to plain decoding, per prompt kind and overall. Quiet machine only; the CPU
model is printed first.

    .venv/bin/python scripts/ablate_drafts.py -m VERIFIER.gguf -md DRAFT.gguf \\
        --variants original,q4_0,q4_0+hot32k --prompts code,prose,edit,chat --temps 0,0.8 --repeats 3 -n 128
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
from pathlib import Path

import numpy as np

from specgguf import tuning
from specgguf.bench.measure import PROMPTS, generate
from specgguf.conversation import Prompts
from specgguf.core.costs import PROBE_CONTEXT, MachineCosts, measure
from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.engine import FixedK
from specgguf.core.hot_vocab import HotVocab
from specgguf.core.kpolicy import adaptive_policy
from specgguf.core.ngram_cache import SessionNgrams
from specgguf.drafts import made
from specgguf.llama.loaded import LoadedModel, ModelSettings
from specgguf.llama.variants import parse_variant


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def open_named(name: str, draft: Path, verifier: LoadedModel, settings: ModelSettings) -> LoadedModel:
    """A draft by its variant name; for a hot vocabulary, "@ids" ranks by id alone (no verifier counts)
    and "@near-miss" reads cold context tokens as near-misses (no embedding rows)."""
    text, _, how = name.partition("@")
    variant = parse_variant(text)
    if variant.is_original:
        return settings.load(draft)
    path = made.derive(draft, variant, None if how == "ids" else verifier)
    model = made.open_draft(path, settings)
    if how == "near-miss" and isinstance(model, HotVocab):
        model.rows = None
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", type=Path, required=True)
    parser.add_argument("-md", type=Path, required=True)
    parser.add_argument("--variants", default="original,q4_0,q4_0-q8head,q4_0+hot32k")
    parser.add_argument("--prompts", default="code,prose,edit,chat")
    parser.add_argument("--temps", default="0,0.8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()} · threads {args.threads}")

    settings = ModelSettings(n_ctx=2048, n_threads=args.threads)
    verifier = settings.load(args.m)
    verify = tuning.probe(verifier).verify
    names = args.variants.split(",")
    drafts = {name: open_named(name, args.md, verifier, settings) for name in names}
    cost = {
        name: min(measure(d, max_batch=1, repeats=5, context=PROBE_CONTEXT, statistic=min))
        for name, d in drafts.items()
    }
    prompts = Prompts(verifier)
    kinds, temps = args.prompts.split(","), [float(t) for t in args.temps.split(",")]
    tokens = {kind: prompts.question(PROMPTS[kind], raw=False, system=None) for kind in kinds}
    rows: dict[str, dict] = {
        name: {"speed": [], "ratio": {}, "accepted": 0, "drafted": 0} for name in ["plain", *names]
    }
    for repeat in range(args.repeats):
        for kind in kinds:
            for temp in temps:
                seed = 1000 * repeat + 7
                plain = generate(
                    verifier, None, tokens[kind], policy=FixedK(0), max_tokens=args.n, temperature=temp, seed=seed
                )
                rows["plain"]["speed"].append(plain.tokens_per_second)
                for name, draft in drafts.items():
                    policy = adaptive_policy("hybrid", MachineCosts(verify, cost[name]))
                    drafter = build_drafter("hybrid", draft, DraftSettings(session=SessionNgrams()))
                    stats = generate(
                        verifier, drafter, tokens[kind], policy=policy, max_tokens=args.n, temperature=temp, seed=seed
                    )
                    row = rows[name]
                    row["speed"].append(stats.tokens_per_second)
                    row["ratio"].setdefault(f"{kind} T={temp:g}", []).append(
                        stats.tokens_per_second / plain.tokens_per_second
                    )
                    row["accepted"] += stats.n_accepted
                    row["drafted"] += stats.n_drafted
    verify_ms = verify[0] * 1000
    print(
        f"verifier token {verify_ms:.1f} ms; tok/s median over {args.repeats} repeats,"
        " ratio = median of paired ratios to plain"
    )
    report = {}
    for name in names:
        row = rows[name]
        ratios = {cell: round(statistics.median(r), 3) for cell, r in row["ratio"].items()}
        all_ratios = [x for r in row["ratio"].values() for x in r]
        report[name] = {
            "ms_per_draft_token": round(cost[name] * 1000, 2),
            "draft_cost_in_verifier_tokens": round(cost[name] / verify[0], 3),
            "acceptance": round(row["accepted"] / row["drafted"], 3) if row["drafted"] else None,
            "tokens_per_second": round(statistics.median(row["speed"]), 2),
            "ratio_to_plain": round(float(np.median(all_ratios)), 3),
            "by_prompt": ratios,
        }
        r = report[name]
        print(
            f"{name:>14}: {r['ms_per_draft_token']:6.2f} ms/draft token"
            f" ({r['draft_cost_in_verifier_tokens']:.2f} of a verifier token) · acceptance {r['acceptance']}"
            f" · {r['tokens_per_second']:.2f} tok/s · {r['ratio_to_plain']:.3f}× plain · "
            + ", ".join(f"{cell} {v:.2f}×" for cell, v in ratios.items())
        )
    print(f"{'plain':>14}: {statistics.median(rows['plain']['speed']):.2f} tok/s")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
