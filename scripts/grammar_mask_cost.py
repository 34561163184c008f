"""What a grammar's token mask costs per token on the verifier's vocabulary (llguidance, llama/guidance.py),
beside one plain decoding step of the verifier: the issue's target is masking <= 10% of a step.

It walks a JSON answer that validates against a tool-call-like schema token by token (the tokens the
verifier's tokenizer gives), and at each token times the mask (`allowed`), the commit (`advance`) and
the forced-token look-up (`forced`); then times plain decoding steps of the verifier for scale.
Then, in the loop: plain decoding (k = 0) of real answers under that schema (two prompts), with
every grammar call and `mask_logits` timed, as a share of the whole generation: what masking adds
to a plain step, on the same tokens (the issue's target: <= 10%).
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

import numpy as np  # noqa: E402

import specgguf.core.engine as engine  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
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
IN_LOOP = (
    "Call get_weather for Paris, France: answer with the call as JSON (name, arguments: city, unit, days).",
    "I need a three-day forecast for Osaka in fahrenheit. Write the get_weather call as JSON.",
)


class TimedConstraint:
    """A constraint whose every call is timed into `seconds`."""

    def __init__(self, inner, seconds: list[float]):
        self.inner, self.seconds = inner, seconds

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - start)

        return timed


def in_loop_share(model: LlamaModel, spec: GrammarSpec, repeats: int) -> None:
    """Plain decoding under the grammar, each grammar call and mask timed: their share of the generation."""
    masking: list[float] = []
    plain_mask = engine.mask_logits

    def timed_mask(logits, allowed):
        start = time.perf_counter()
        try:
            return plain_mask(logits, allowed)
        finally:
            masking.append(time.perf_counter() - start)

    engine.mask_logits = timed_mask
    print("\nin the loop, k = 0 (greedy; every grammar call and mask timed):")
    print("| prompt | tokens | ms per token | grammar + mask ms per token | share |\n|---|---|---|---|---|")
    for question in IN_LOOP:
        shares, per_token, spent_ms, n_tokens = [], [], [], 0
        for _ in range(repeats):
            masking.clear()
            model.clear()
            prompt = Prompts(model).question(question, raw=False, system=None)
            constraint = TimedConstraint(constraint_for(model, spec), masking)
            events = engine.speculate(
                verifier=model,
                prompt_tokens=prompt,
                k=0,
                max_tokens=96,
                settings=SamplingSettings(temperature=0.0),
                rng=np.random.default_rng(0),
                constraint=constraint,
            )
            started, prefill, n_tokens = time.perf_counter(), 0.0, 0
            for event in events:
                prefill += event.prefill_seconds
                n_tokens += len(event.tokens)
            wall = time.perf_counter() - started - prefill
            shares.append(sum(masking) / wall)
            per_token.append(wall * 1000 / n_tokens)
            spent_ms.append(sum(masking) * 1000 / n_tokens)
        print(
            f"| {question[:40]}… | {n_tokens} | {statistics.median(per_token):.1f} |"
            f" {statistics.median(spent_ms):.3f} | {statistics.median(shares):.2%} |"
        )
    engine.mask_logits = plain_mask


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
    tokens = model.tokenize(json.dumps(ANSWER, separators=(",", ":")), special=False)  # compact: a layout it takes
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
    in_loop_share(model, spec, args.repeats)


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
