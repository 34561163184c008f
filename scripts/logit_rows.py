"""What a verify pass costs by rows, with every row's logits (what a verify step asks for) against only
the last row's (what `llama-bench -p N` and a prompt pass compute), and what that leaves a speculative
step at best: the most tokens a second that a chain of K free drafts, each right with chance a given the
ones before, can give over plain decoding, max over K of E_a(K) / T(K + 1) · T(1), with
E_a(K) = 1 + a + … + a^K. Interleaved rounds (each size in turn, every other round reversed), medians,
after `--context` tokens in the cache. Quiet machine only, one benchmark at a time:

    .venv/bin/python scripts/logit_rows.py -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --llama-tools build/llama.cpp/bin -t 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.llama_tools import LlamaTools  # noqa: E402
from specgguf.bench.machine import machine_lines, machine_report  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

CHANCES = (0.7, 0.85, 0.95, 1.0)  # a draft's chance of being right, given the ones before it were


def curves(model: LlamaModel, rows: list[int], *, context: int, rounds: int) -> dict[tuple[int, int], float]:
    """Median seconds of a pass of n rows with 1 and with n logits rows, keyed (n, logits)."""
    model.eval([(17 + 31 * i) % model.n_vocab for i in range(context)], n_logits=1)
    sizes = [(n, logits) for n in rows for logits in sorted({1, n})]
    batch = [(5003 + 7 * i) % model.n_vocab for i in range(max(rows))]
    seconds: dict[tuple[int, int], list[float]] = {size: [] for size in sizes}
    for round_ in range(rounds + 1):  # the first round warms up
        for n, logits in sizes if round_ % 2 else sizes[::-1]:
            started = time.perf_counter()
            model.eval(batch[:n], n_logits=logits)
            elapsed = time.perf_counter() - started
            model.rewind(context)
            if round_:
                seconds[n, logits].append(elapsed)
    return {size: statistics.median(times) for size, times in seconds.items()}


def ceiling(curve: dict[int, float], chance: float, draft: float = 0.0) -> tuple[float, int]:
    """(the best speedup over plain decoding, the K that gives it) for drafts right with `chance`, each
    costing `draft` seconds to make (0: free, as prompt lookup's)."""
    return max((sum(chance**i for i in range(n)) / (curve[n] + (n - 1) * draft) * curve[1], n - 1) for n in curve)


def draft_seconds(path: Path, *, threads: int, rounds: int) -> float:
    """A draft model's seconds a token: one row with its logits, after 256 tokens, the median."""
    model = LlamaModel(path, n_ctx=512, n_threads=threads)
    seconds = curves(model, [1], context=256, rounds=rounds)[1, 1]
    model.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, action="append", required=True, help="a verifier (repeatable)")
    parser.add_argument("--rows", default="1,2,3,4,5,6,8")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-md", "--model-draft", type=Path, help="a draft model: its token's cost in the ceilings")
    parser.add_argument(
        "--llama-tools", type=Path, help="llama.cpp's programs (make llama-tools): llama-bench's figures"
    )
    args = parser.parse_args()
    try:
        rows = sorted({1, *map(int, args.rows.split(","))})
    except ValueError:
        parser.error(f"--rows {args.rows!r}: row counts separated by commas, e.g. 1,2,4,8")
    if rows[0] < 1:
        parser.error(f"--rows {args.rows!r}: a pass has 1 row or more")
    if args.llama_tools:
        report = machine_report(
            LlamaTools.find(args.llama_tools, option="--llama-tools"), [(p.name, p) for p in args.model], args.threads
        )
        print(machine_lines(report))
    draft = None
    if args.model_draft:
        draft = draft_seconds(args.model_draft, threads=args.threads, rounds=args.rounds)
        print(f"{args.model_draft.name}: {draft * 1000:.1f} ms a token (one row, its logits)")
    for path in args.model:
        model = LlamaModel(path, n_ctx=args.context + max(rows) + 16, n_threads=args.threads)
        costs = curves(model, rows, context=args.context, rounds=args.rounds)
        model.close()
        every = {n: costs[n, n] for n in rows}
        last = {n: costs[n, 1] for n in rows}
        print(f"\n{path.name}, after {args.context} tokens, -t {args.threads}, median of {args.rounds} rounds")
        print("| rows | last row's logits | every row's logits | one more logits row |")
        print("|---|---|---|---|")
        for n in rows:
            extra = (every[n] - last[n]) / (n - 1) * 1000 if n > 1 else 0.0
            print(
                f"| {n} | {last[n] * 1000:.1f} ms ({last[n] / last[1]:.2f}×) | {every[n] * 1000:.1f} ms"
                f" ({every[n] / every[1]:.2f}×) | {extra:.1f} ms |"
            )
        for chance in CHANCES:
            best_every, k_every = ceiling(every, chance)
            best_last, k_last = ceiling(last, chance)
            print(
                f"free drafts right {chance:.2f}: at best {best_every:.2f}× plain (K {k_every}) with every row's"
                f" logits; {best_last:.2f}× (K {k_last}) on the last-row curve"
            )
            if draft is not None:
                best_model, k_model = ceiling(every, chance, draft)
                print(f"  a draft model's tokens right {chance:.2f}: at best {best_model:.2f}× plain (K {k_model})")


if __name__ == "__main__":
    run_script(main)
