"""How fast a draft model (with prompt lookup beside it) could make each suite answer at best: an upper bound.

scripts/copy_bound.py asks it of prompt lookup alone; this asks it of the default's drafters together, on a
memory-bound verifier where the draft model's own passes are the cost to beat. Each suite prompt is decoded
greedily by the verifier alone; the draft model then reads prompt + answer in one batch, which gives its
argmax at every answer position for exactly the verifier's prefix — what it would draft there, greedy. An
oracle that knows how far each source is right schedules the verify steps:

- `model` at t: the draft model's run A_t, the number of answer tokens from t on that equal its argmax;
  K ≤ A_t drafts cost K draft passes (each draft token is one pass of the draft over the token before it);
- `copy` at t: scripts/copy_bound.py's run C_t (the longest answer[t:t+L] found earlier in the prompt or
  answer), drafted free;
- `both`: K ≤ C_t free, or the copy's C_t tokens and then the model's, K ≤ C_t + A_{t+C_t}, for K − C_t
  passes (the draft reads the copied tokens in the pass of its newest token, as the hybrid's read-ahead does),
  or the model alone.

time(t) = min over K of verify[K + 1 rows] + draft(K, t) + time(t + K + 1), and each bound is
(n − 1)·verify[1 row] / time(1), a ratio to plain decoding at the same cost table. It leaves out sampling,
the engine's time and every wrong draft, so no drafter reaches it: it reads as a ceiling on `default ÷ -k 0`
for chain drafting with this draft file on this machine. Quiet machine only (it measures both models' passes;
it starts itself again with the program's huge pages). `--out FILE` keeps what scripts/draft_policies.py replays:

    .venv/bin/python scripts/draft_bound.py -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf \\
        -md ~/.cache/specgguf/drafts/…-q4_0.gguf -n 128 --prompts prose-explain,chat-git --out /tmp/bound.json
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

from copy_bound import copy_runs, schedule_time  # noqa: E402
from ngram_evidence import answer  # noqa: E402

from specgguf.bench.machine import cpu  # noqa: E402
from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.costs import measure  # noqa: E402
from specgguf.llama.loaded import ModelSettings  # noqa: E402

DraftCost = Callable[[int, int], float | None]  # (t, K) -> draft seconds for K right drafts at t, None: not right


def model_runs(draft, prompt: list[int], reply: list[int]) -> tuple[list[int], list[float]]:
    """For each answer position t: how many of reply[t:] equal the draft's argmax for their own prefix,
    and the draft's top probability there (its confidence, T 1)."""
    draft.rewind(0)
    logits = draft.eval(prompt + reply[:-1], n_logits=len(reply))  # row i scores position len(prompt) + i
    draft.rewind(0)
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    confidence = (1.0 / np.exp(logits - top).sum(axis=1)).tolist()
    agree = (np.argmax(logits, axis=1) == np.asarray(reply)).tolist()
    return runs_of(agree), confidence


def runs_of(right: list[bool]) -> list[int]:
    """For each position t: how many positions from t on are right in a row."""
    runs = [0] * (len(right) + 1)
    for t in range(len(right) - 1, -1, -1):
        runs[t] = runs[t + 1] + 1 if right[t] else 0
    return runs[:-1]


def costs(model: list[int], copy: list[int], per_pass: float) -> dict[str, DraftCost]:
    def by_model(t: int, k: int) -> float | None:
        return k * per_pass if k <= model[t] else None

    def by_copy(t: int, k: int) -> float | None:
        return 0.0 if k <= copy[t] else None

    def by_both(t: int, k: int) -> float | None:
        c = copy[t]
        if k <= c:
            return 0.0
        then = model[t + c] if t + c < len(model) else 0
        options = [k * per_pass] if k <= model[t] else []
        if c and k <= c + then:
            options.append((k - c) * per_pass)
        return min(options) if options else None

    return {"model": by_model, "copy": by_copy, "both": by_both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True, type=Path)
    parser.add_argument("-md", "--draft", required=True, type=Path)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--max-rows", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", help="comma-separated suite names (default: all)")
    parser.add_argument("--out", type=Path, help="write the curves and, per prompt, the answer, runs and confidences")
    args = parser.parse_args()
    chosen = set(args.prompts.split(",")) if args.prompts else None
    unknown = sorted(chosen - {item.name for item in load_suite()}) if chosen else []
    if unknown:
        sys.exit(f"specgguf: error: not in the suite: {', '.join(unknown)}")
    here = cpu()
    print(f"CPU: {here['cpu']} ({here['cores']} cores), avx512_vnni: {'yes' if here['avx512_vnni'] else 'no'}")
    settings = ModelSettings(n_ctx=4096, n_threads=args.threads)
    verifier, draft = settings.load(args.model), settings.load(args.draft)
    verify = list(np.maximum.accumulate(measure(verifier, max_batch=args.max_rows, repeats=5)))
    per_pass = measure(draft, max_batch=1, repeats=9)[0]
    by_rows = (f"{n}: {c * 1000:.1f} ({c / verify[0]:.2f}×)" for n, c in enumerate(verify, 1))
    print("verify ms by rows: " + " · ".join(by_rows))
    print(f"draft pass: {per_pass * 1000:.1f} ms ({per_pass / verify[0]:.2f} of a verifier row)")
    prompts = Prompts(verifier)
    found: dict[str, list[float]] = {"model": [], "copy": [], "both": []}
    kept: list[dict[str, Any]] = []
    for item in load_suite():
        if chosen is not None and item.name not in chosen:
            continue
        tokens = prompts.question(item.text, raw=False, system=None)
        reply = answer(verifier, tokens, args.n)
        (model, confidence), copy = model_runs(draft, tokens, reply), copy_runs(tokens, reply)
        kept.append(
            {
                "prompt": item.name,
                "kind": item.kind,
                "reply": reply,
                "model": model,
                "copy": copy,
                "confidence": confidence,
            }
        )
        plain = (len(reply) - 1) * verify[0]
        schedules = costs(model, copy, per_pass)
        bounds = {name: plain / schedule_time(len(reply), verify, cost) for name, cost in schedules.items()}
        for name, bound in bounds.items():
            found[name].append(bound)
        agreed = sum(1 for r in model if r > 0) / max(1, len(reply))
        print(
            f"{item.name:20} {item.kind:12} {len(reply):4d} tokens, the draft's argmax right at {agreed:.0%};"
            f" bound ÷ plain: model {bounds['model']:.2f}×, copy {bounds['copy']:.2f}×, both {bounds['both']:.2f}×",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps({"verify": verify, "draft_pass": per_pass, "prompts": kept}))
    if found["both"]:
        print("median bound ÷ plain: " + ", ".join(f"{k} {statistics.median(v):.2f}×" for k, v in found.items()))


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
