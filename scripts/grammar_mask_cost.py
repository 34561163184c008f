"""What a grammar's token mask costs per token on the verifier's vocabulary (llguidance, llama/guidance.py),
beside one plain decoding step of the verifier: the issue's target is masking <= 10% of a step.

It walks a JSON answer that validates against a tool-call-like schema token by token (the tokens the
verifier's tokenizer gives), and at each token times the mask (`allowed`), the commit (`advance`) and
the forced-token look-up (`forced`); then times plain decoding steps of the verifier for scale.
Default: the default pair's Q4_K_M verifier (151,936 tokens). Run on a quiet machine:

    .venv/bin/python scripts/grammar_mask_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.files.assets import cache_dir  # noqa: E402
from specgguf.grammar import GrammarSpec, constraint_for  # noqa: E402
from specgguf.llama.guidance import guidance_tokenizer  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit", "days"],
        },
    },
    "required": ["name", "arguments"],
}
ANSWER = {"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius", "days": 3}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, default=cache_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="plain decoding steps timed per repeat")
    args = parser.parse_args()
    model = LlamaModel(args.model, n_ctx=512)
    start = time.perf_counter()
    guidance_tokenizer(model)
    print(
        f"{args.model.name}: {model.n_vocab} tokens; llguidance tokenizer built in {time.perf_counter() - start:.2f} s"
    )
    spec = GrammarSpec.json_schema(SCHEMA)
    start = time.perf_counter()
    spec.compile()
    print(f"schema compiled in {(time.perf_counter() - start) * 1000:.1f} ms")
    tokens = model.tokenize(json.dumps(ANSWER), special=False)
    tokens = tokens[1:] if tokens and not model.token_bytes(tokens[0]) else tokens
    mask_ms, advance_ms, forced_ms, plain_ms = [], [], [], []
    for _ in range(args.repeats):
        constraint = constraint_for(model, spec)
        for token in tokens:
            t0 = time.perf_counter()
            allowed = constraint.allowed()
            t1 = time.perf_counter()
            constraint.forced()
            t2 = time.perf_counter()
            assert allowed[token], f"the grammar refuses {model.token_bytes(token)!r}"
            constraint.advance(token)
            t3 = time.perf_counter()
            mask_ms.append((t1 - t0) * 1000)
            forced_ms.append((t2 - t1) * 1000)
            advance_ms.append((t3 - t2) * 1000)
        model.clear()
        model.eval(tokens[:8], n_logits=1)
        for token in tokens[8 : 8 + args.steps]:
            t0 = time.perf_counter()
            model.eval([token], n_logits=1)
            plain_ms.append((time.perf_counter() - t0) * 1000)
    step, mask = statistics.median(plain_ms), statistics.median(mask_ms) + statistics.median(advance_ms)
    print(f"{len(tokens)} answer tokens x {args.repeats} repeats (medians, ms per token):")
    print("| mask | advance | forced look-up | mask + advance | plain step | mask + advance / step |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {statistics.median(mask_ms):.3f} | {statistics.median(advance_ms):.3f} |"
        f" {statistics.median(forced_ms):.3f} | {mask:.3f} | {step:.1f} | {mask / step:.1%} |"
    )


if __name__ == "__main__":
    main()
