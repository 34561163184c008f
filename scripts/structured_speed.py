"""Structured answers with speculation (the server's defaults) vs the same requests with `speculative.k = 0`
(the verifier alone). The default pair through a live `specgguf serve`, greedy, the two settings
interleaved per prompt and repeat; it prints the share of answer tokens that came as accepted
drafts, by source. The issue's target: >= 1.3x from forced-token drafts. The server's n-gram cache
learns every answer it makes, so a repeat of a prompt copies the last one's answer: the first pass (every
prompt new to the server, though not its kind) is reported apart from the later ones. What masking costs a plain
step is scripts/grammar_mask_cost.py (the same tokens with every grammar call timed: a request
without the grammar would be another prompt and another answer). Quiet machine only:

    .venv/bin/python scripts/structured_speed.py --repeats 3
    .venv/bin/python scripts/structured_speed.py --only 1 --repeats 1   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from structured_validation import SCHEMA_PROMPTS, TOOL_PROMPTS, TOOLS, server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, default=6, help="prompts of each set (json_schema, tools)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", "--max-tokens", type=int, default=200)
    args, extra = parser.parse_known_args()
    cases: list[tuple[str, str, dict | None]] = [
        ("json_schema", p, schema) for schema, p in SCHEMA_PROMPTS[: args.only]
    ]
    cases += [("tools", prompt, None) for prompt in TOOL_PROMPTS[: args.only]]
    seconds: dict[str, dict[str, list[float]]] = {}  # setting -> kind -> ms per token
    rates: dict[str, list[float]] = {"spec": [], "k0": []}  # per request: tokens/s
    ratios: list[list[float]] = []  # per pass over the prompts
    sources = Counter[str]()
    n_tokens = 0  # answer tokens, with speculation
    with server(extra) as url:
        client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        for _ in range(args.repeats):
            ratios.append([])
            for kind, prompt, schema in cases:
                base = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0,
                    "max_tokens": args.max_tokens,
                }
                shaped = (
                    dict(base, tools=TOOLS)
                    if kind == "tools"
                    else dict(
                        base,
                        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                    )
                )
                settings = {"spec": shaped, "k0": dict(shaped, extra_body={"speculative": {"k": 0}})}
                step = {}
                for name, request in settings.items():
                    timings = client.chat.completions.create(**request).model_extra["timings"]
                    seconds.setdefault(name, {}).setdefault(kind, []).append(timings["predicted_per_token_ms"])
                    step[name] = timings["predicted_per_second"]
                    if name == "spec":
                        sources.update(timings.get("draft_n_accepted_by_source", {}))
                        n_tokens += timings["predicted_n"]
                for name in rates:
                    rates[name].append(step[name])
                ratios[-1].append(step["spec"] / step["k0"] if step["k0"] else 0.0)
    print(f"{len(cases)} prompts x {args.repeats} repeats, greedy, max_tokens {args.max_tokens}\n")
    print("| | spec (defaults) | k = 0 | spec / k = 0 (median, min-max) |\n|---|---|---|---|")
    every = [ratio for one in ratios for ratio in one]
    print(
        f"| tok/s (median) | {statistics.median(rates['spec']):.1f} | {statistics.median(rates['k0']):.1f} |"
        f" {_spread(every)} |"
    )
    print(f"| the first pass (every prompt new to the server) | | | {_spread(ratios[0])} |")
    for kind in ("json_schema", "tools"):
        first = [ratio for ratio, case in zip(ratios[0], cases) if case[0] == kind]
        print(f"| ... of which {kind} | | | {_spread(first)} |")
    if len(ratios) > 1:
        print(f"| later passes (the server made these answers before) | | | {_spread(every[len(ratios[0]) :])} |")
    shares = ", ".join(f"{source} {n} ({n / max(1, n_tokens):.0%})" for source, n in sorted(sources.items()))
    print(f"\n{n_tokens} answer tokens with speculation; accepted drafts by source: {shares}\n")
    print("| ms per token, median | spec | k = 0 |\n|---|---|---|")
    for kind in ("json_schema", "tools"):
        spec, plain = (statistics.median(seconds[name][kind]) for name in ("spec", "k0"))
        print(f"| {kind} | {spec:.1f} | {plain:.1f} |")


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


if __name__ == "__main__":
    main()
