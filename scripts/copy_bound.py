"""How fast prompt lookup could make each suite answer at best on this machine: an upper bound.

Decodes each suite prompt greedily with the verifier alone, measures the verify curve here (seconds for
1..--max-rows rows with logits for every row, core/costs.measure), then asks what the fastest schedule of
verify steps could be if every n-gram draft were right whenever the answer's next tokens exist as text
earlier (an oracle over the answer itself, so no real drafter reaches it):

- `copy`: at answer position t, the longest run answer[t:t+L] found anywhere in the prompt or the answer
  before t (a drafter that always picks the right place to copy from);
- `lookup`: what the suffix lookup of scripts/ngram_evidence.py proposes there (the longest earlier match
  of the newest 2..8 tokens) and greedy would keep.

Given L_t, the best schedule is a shortest path: time(t) = min over K ≤ min(L_t, max rows - 1) of
verify[K + 1 rows] + time(t + K + 1), time(n) = 0, and the bound is (n − 1)·verify[1 row] / time(1), a ratio to
plain decoding at the same cost table ((n − 1) passes: the prompt's pass scores the first token). It
leaves out everything but verify passes (sampling, the engine's own time), so it reads as a ceiling on
`default ÷ -k 0`. Quiet machine only (it measures the curve):

    .venv/bin/python scripts/copy_bound.py -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -n 128

`--out FILE` keeps the curve and, per prompt, the answer, both runs, the bounds and the verifier's
probability of each token it wrote: what scripts/policy_replay.py replays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ngram_evidence import answer_with_confidence, replay  # noqa: E402

from specgguf.bench.machine import cpu  # noqa: E402
from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.costs import measure  # noqa: E402
from specgguf.llama.loaded import ModelSettings  # noqa: E402


def copy_runs(prompt: list[int], reply: list[int]) -> list[int]:
    """For each answer position t: the longest reply[t:t+L] found in prompt + reply[:t]."""
    runs = []
    for t in range(len(reply)):
        text = np.asarray(prompt + reply[:t], dtype=np.int64)
        starts = np.flatnonzero(text == reply[t]) if t < len(reply) else np.empty(0, dtype=np.int64)
        best = 0
        for start in starts.tolist():
            length = 0
            while t + length < len(reply) and start + length < len(text) and text[start + length] == reply[t + length]:
                length += 1
            best = max(best, length)
        runs.append(best)
    return runs


def schedule_time(n: int, verify: list[float], cost: Callable[[int, int], float | None]) -> float:
    """The shortest schedule of verify passes over an answer of n tokens: time(t) = min over K of
    verify[K] + cost(t, K) + time(t + K + 1), K + 1 rows a pass, where cost(t, K) is what drafting K
    tokens at t that are all kept costs (None: they would not all be kept). The prompt's pass scores
    token 0, so the schedule starts at token 1 (drafts from there on are the first step's)."""
    time = [0.0] * (n + 1)
    for t in range(n - 1, 0, -1):
        options = []
        for k in range(min(len(verify) - 1, n - t - 1) + 1):
            spent = cost(t, k)
            if spent is not None:
                options.append(verify[k] + spent + time[t + k + 1])
        time[t] = min(options)
    return time[1] if n > 1 else 0.0


def best_time(runs: list[int], verify: list[float]) -> float:
    """The shortest schedule when drafts of up to runs[t] tokens at t are free and all kept."""
    return schedule_time(len(runs), verify, lambda t, k: 0.0 if k <= runs[t] else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True, type=Path)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--max-rows", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", help="comma-separated suite names (default: all)")
    parser.add_argument("--out", type=Path, help="write the answers and runs as JSON")
    args = parser.parse_args()
    here = cpu()
    print(f"CPU: {here['cpu']} ({here['cores']} cores), avx512_vnni: {'yes' if here['avx512_vnni'] else 'no'}")
    verifier = ModelSettings(n_ctx=4096, n_threads=args.threads).load(args.model)
    verify = measure(verifier, max_batch=args.max_rows, repeats=5)
    verify = list(np.maximum.accumulate(verify))  # never cheaper for more rows (noise)
    by_rows = (f"{n}: {c * 1000:.1f} ({c / verify[0]:.2f}×)" for n, c in enumerate(verify, 1))
    print("verify ms by rows: " + " · ".join(by_rows))
    print(f"best pass for its tokens: {max((k + 1) * verify[0] / c for k, c in enumerate(verify)):.2f}× plain")
    chosen = set(args.prompts.split(",")) if args.prompts else None
    prompts = Prompts(verifier)
    rows: list[dict[str, Any]] = []
    everything: list[dict[str, Any]] = []
    for item in load_suite():
        if chosen is not None and item.name not in chosen:
            continue
        tokens = prompts.question(item.text, raw=False, system=None)
        reply, confidence = answer_with_confidence(verifier, tokens, args.n)
        copy = copy_runs(tokens, reply)
        kept = {r["t"]: r["kept"] for r in replay(tokens, reply, max_ngram=8, min_ngram=2, k=args.max_rows - 1)}
        lookup = [kept.get(t, 0) for t in range(len(reply))]
        plain = (len(reply) - 1) * verify[0]  # the prompt's pass scores the first token
        row = {
            "prompt": item.name,
            "kind": item.kind,
            "tokens": len(reply),
            "copyable": sum(1 for r in copy if r > 0) / max(1, len(reply)),
            "copy_bound": plain / best_time(copy, verify) if plain else 1.0,
            "lookup_bound": plain / best_time(lookup, verify) if plain else 1.0,
        }
        rows.append(row)
        everything.append({**row, "reply": reply, "copy": copy, "lookup": lookup, "confidence": confidence})
        print(
            f"{item.name:20} {item.kind:12} {len(reply):4d} tokens, {row['copyable']:.0%} continue a copy;"
            f" bound ÷ plain: copy {row['copy_bound']:.2f}×, lookup {row['lookup_bound']:.2f}×",
            flush=True,
        )
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        print(
            f"{kind:12} median bound ÷ plain: copy {statistics.median(r['copy_bound'] for r in mine):.2f}×,"
            f" lookup {statistics.median(r['lookup_bound'] for r in mine):.2f}× ({len(mine)} prompts)"
        )
    if args.out:
        args.out.write_text(json.dumps({"verify": verify, "prompts": everything}))


if __name__ == "__main__":
    main()
