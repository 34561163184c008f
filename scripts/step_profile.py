"""Where a speculative step's time goes, at a fixed K: draft, draft catch-up, verify, the rest.

Wraps both models' `eval` to count llama.cpp calls and prints per-step milliseconds as one
JSON line. Compare with `llama-speculative-simple --spec-type draft-simple
--spec-draft-n-max K` on the same prompt (docs/benchmarks.md). Quiet machine only:

    .venv/bin/python scripts/step_profile.py -m VERIFIER.gguf -md DRAFT.gguf -k 4 "Explain why the sky is blue."
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.engine import speculate  # noqa: E402
from specgguf.core.model_drafter import ModelDrafter  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.llama.variants import parse_request  # noqa: E402
from specgguf.prepare import LoadOptions, load_models  # noqa: E402


def count_calls(model, totals: dict, name: str) -> None:
    """Add each `eval` call's count and seconds to totals[name + ...]."""
    original = model.eval

    def timed(tokens, *, n_logits):
        started = time.perf_counter()
        rows = original(tokens, n_logits=n_logits)
        totals[f"{name}_calls"] = totals.get(f"{name}_calls", 0) + 1
        totals[f"{name}_seconds"] = totals.get(f"{name}_seconds", 0.0) + time.perf_counter() - started
        return rows

    model.eval = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", required=True, type=Path)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--draft-variant", default="original", help="auto, original or a variant (drafts/made.py)")
    parser.add_argument("prompt")
    args = parser.parse_args()
    pair = ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None)
    verifier, loaded, _ = load_models(
        pair, LoadOptions(n_ctx=2048, draft_variant=parse_request(args.draft_variant)), need_draft=True
    )
    assert loaded is not None
    draft = loaded
    tokens = Prompts(verifier).question(args.prompt, raw=False, system=None)
    calls: dict = {}
    count_calls(verifier, calls, "verifier")
    count_calls(draft, calls, "draft")
    steps = {"draft": 0.0, "catchup": 0.0, "verify": 0.0, "sample_and_rollback": 0.0}
    n_steps = n_drafted = n_accepted = n_tokens = 0
    started, prefill = time.perf_counter(), 0.0
    events = speculate(
        verifier=verifier,
        drafter=ModelDrafter(draft),
        prompt_tokens=tokens,
        k=args.k,
        max_tokens=args.n,
        settings=SamplingSettings(temperature=args.temp),
        rng=np.random.default_rng(1),
    )
    for event in events:
        prefill += event.prefill_seconds  # the prompt is not part of a step
        steps["draft"] += event.draft_seconds - event.draft_catchup_seconds
        steps["catchup"] += event.draft_catchup_seconds
        steps["verify"] += event.verify_seconds
        steps["sample_and_rollback"] += event.sample_seconds
        n_steps += 1
        n_drafted += event.n_drafted
        n_accepted += event.n_accepted
        n_tokens += len(event.tokens)
    wall = time.perf_counter() - started - prefill
    per_step = {name: round(1000 * seconds / n_steps, 1) for name, seconds in steps.items()}
    per_step["outside_the_loop_parts"] = round(1000 * (wall - sum(steps.values())) / n_steps, 1)
    print(
        json.dumps(
            {
                "k": args.k,
                "tokens_per_second": round(n_tokens / wall, 2),
                "steps": n_steps,
                "acceptance": round(n_accepted / max(1, n_drafted), 3),
                "ms_per_step": per_step,
                "llama_calls_per_step": {
                    # Less the one call each model spent reading the prompt.
                    name: round((calls.get(f"{name}_calls", 0) - 1) / n_steps, 2)
                    for name in ("draft", "verifier")
                },
            }
        )
    )


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
