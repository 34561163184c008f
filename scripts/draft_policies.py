"""What simple draft-model policies could make of each answer that scripts/draft_bound.py stored: between
the oracle's ceiling and what the default measured.

Replays, on the stored curves (verify seconds by rows, one draft pass) and each answer's draft runs and
confidences along the verifier's own answer, greedy:

- fixed K: K draft passes a step, the first A_t of them kept;
- p-min θ (llama.cpp's `--draft-p-min`, K ≤ 8): draft while the draft's top probability is at least θ; the
  pass that falls below θ is spent and its token not proposed. Past the first wrong draft the draft's
  context is no longer the answer's and its confidences are unknown: replayed both ways, drafting on
  to K (too harsh) and stopping there (flattering: a real one drafts on until its confidence falls);
- the oracle: draft_bound.py's `model` bound (every step drafts exactly what will be kept).

Each as a ratio to plain decoding at the same costs; sampling and the engine's own time left out.

    .venv/bin/python scripts/draft_policies.py /tmp/bound.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from copy_bound import schedule_time  # noqa: E402
from draft_bound import costs  # noqa: E402

K_MAX = 8
THRESHOLDS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def replay(
    model: list[int],
    confidence: list[float],
    verify: list[float],
    per_pass: float,
    *,
    k: int,
    p_min: float,
    stop_wrong: bool,
) -> float:
    """Seconds for the answer from token 1 on (the prompt's pass scores token 0)."""
    n, t, spent = len(model), 1, 0.0
    while t < n:
        proposed = passes = 0
        most = min(k, n - t - 1)
        while proposed < most:
            passes += 1
            if confidence[t + proposed] < p_min:
                break
            proposed += 1
            if proposed > model[t]:  # a wrong draft: past it the confidences are unknown (see above)
                if not stop_wrong:  # it drafts on to K, every pass spent
                    proposed = passes = most
                break
        kept = min(model[t], proposed)
        spent += passes * per_pass + verify[proposed]
        t += kept + 1
    return spent


def policies(item: dict[str, Any], verify: list[float], per_pass: float) -> str:
    """One answer's line: each policy's best setting and its ratio to plain decoding."""
    model, confidence = item["model"], item["confidence"]
    plain = (len(model) - 1) * verify[0]

    def rate(k: int, p_min: float, stop_wrong: bool) -> float:
        return plain / replay(model, confidence, verify, per_pass, k=k, p_min=p_min, stop_wrong=stop_wrong)

    fixed = {k: rate(k, 0.0, False) for k in range(1, K_MAX + 1)}
    gated = {p: rate(K_MAX, p, False) for p in THRESHOLDS}
    flattered = {p: rate(K_MAX, p, True) for p in THRESHOLDS}
    oracle = plain / schedule_time(len(model), verify, costs(model, item["copy"], per_pass)["model"])
    k = max(fixed, key=fixed.__getitem__)
    p, q = (max(found, key=found.__getitem__) for found in (gated, flattered))
    return (
        f"{item['prompt']:20} K={k} {fixed[k]:.2f}×       θ={p:.1f} {gated[p]:.2f}×"
        f"             θ={q:.1f} {flattered[q]:.2f}×                           {oracle:.2f}×"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stored", type=Path, help="draft_bound.py --out's file")
    parser.add_argument("--draft-ms", type=float, help="price a draft pass at this instead of the stored measurement")
    args = parser.parse_args()
    try:
        stored = json.loads(args.stored.read_text())
        per_pass = args.draft_ms / 1000 if args.draft_ms else float(stored["draft_pass"])
        lines = [policies(item, stored["verify"], per_pass) for item in stored["prompts"]]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        sys.exit(
            f"specgguf: error: {args.stored}: not a file draft_bound.py --out wrote ({type(error).__name__}: {error})"
        )
    print("prompt               best fixed K    best p-min (K ≤ 8)   the same, stopped at a wrong draft   oracle")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
