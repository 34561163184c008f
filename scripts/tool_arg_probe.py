"""The argument-value probe (issue 37): does a grammar keep the model's own distribution?

Asked "What is the weather in Paris?" with a get_weather tool, the model's call should name "Paris" as
often under the call grammar as it does unconstrained; the same for a `json_schema` answer
({"city": string}). Through a live `specgguf serve` on 127.0.0.1 (the default pair unless -m/-md are
given; extra options go to the server), with the openai SDK, seeded samples at each temperature, with
`k = 0` and with the server's default drafting:

- tools, grammar: `tools=[get_weather]` (tool_choice "auto"): the call as the server parses it.
- tools, free: the same request with tool_choice "none" — the same prompt (the tools rendered by the
  chat template), no grammar, nothing parsed by the server — the call read from the text with the
  server's own parser (serve/tool_syntax.py). The prompts' token counts are checked to be equal.
- json, grammar: `response_format` json_schema; json, free: the same messages without it, the first
  JSON object read from the text.

Prints one row per cell (samples, how many named "Paris", the other values) and, per task, K and
temperature, Fisher's exact test of grammar against free: p above 0.05 is "the same within sampling
noise". A quiet machine, about 400 requests with the defaults:

    .venv/bin/python scripts/tool_arg_probe.py                # 24 samples per cell, T 0.8 and 1.0
    .venv/bin/python scripts/tool_arg_probe.py --samples 2    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from specgguf.serve.tool_syntax import SYNTAXES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_server import live_server  # noqa: E402

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
JSON_MESSAGES = [
    {"role": "system", "content": 'Answer with a JSON object {"city": ...}: the city the question is about.'},
    {"role": "user", "content": "What is the weather in Paris?"},
]
MISSING = "(none)"  # no call, or no JSON object, in the answer


def tool_city(client, model: str, *, grammar: bool, **options) -> tuple[str, int]:
    """The get_weather call's city (MISSING without one) and the prompt's token count."""
    tool_choice = "auto" if grammar else "none"
    response = client.chat.completions.create(
        model=model, messages=TOOL_MESSAGES, tools=[WEATHER], tool_choice=tool_choice, **options
    )
    message = response.choices[0].message
    if grammar:
        arguments = [
            call.function.arguments for call in message.tool_calls or [] if call.function.name == "get_weather"
        ]
    else:
        text = message.content or ""
        syntax = SYNTAXES["hermes"]  # Qwen2.5's; family_of(template) for other models
        start = syntax.call_start(text, ["get_weather"])
        calls = [] if start is None else syntax.parse(text[start:], ["get_weather"])
        arguments = [call.arguments for call in calls if call.complete]
    return (_city(arguments[0]) if arguments else MISSING), response.usage.prompt_tokens


def json_city(client, model: str, *, grammar: bool, **options) -> tuple[str, int]:
    """The answer's `city` (MISSING without a JSON object) and the prompt's token count."""
    if grammar:
        schema = {"name": "city", "schema": CITY_SCHEMA, "strict": True}
        options["response_format"] = {"type": "json_schema", "json_schema": schema}
    response = client.chat.completions.create(model=model, messages=JSON_MESSAGES, **options)
    text = response.choices[0].message.content or ""
    at = text.find("{")
    return (_city(text[at:]) if at >= 0 else MISSING), response.usage.prompt_tokens


def _city(text: str) -> str:
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return MISSING
    return str(value.get("city", MISSING)) if isinstance(value, dict) else MISSING


def fisher_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Fisher's exact test, two-sided: a of n_a against b of n_b."""
    total, hits = n_a + n_b, a + b

    def chance(x: int) -> float:
        return math.comb(hits, x) * math.comb(total - hits, n_a - x) / math.comb(total, n_a)

    observed = chance(a)
    low, high = max(0, hits - n_b), min(hits, n_a)
    return min(1.0, sum(chance(x) for x in range(low, high + 1) if chance(x) <= observed * (1 + 1e-9)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24, help="seeded samples per cell (default 24)")
    parser.add_argument("--temps", type=float, nargs="+", default=[0.8, 1.0])
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every sample's value")
    args, extra = parser.parse_known_args()
    tasks = {"tools": tool_city, "json": json_city}
    drafting = {"k=0": {"speculative": {"k": 0}}, "default": None}
    counts: dict[tuple[str, str, float, bool], Counter[str]] = {}
    with live_server(*extra, startup_timeout=600) as server:
        client = server.client(timeout=600)
        model = client.models.list().data[0].id
        for task, ask in tasks.items():
            for k_name, extra_body in drafting.items():
                for temperature in args.temps:
                    prompt_tokens = set()
                    for grammar in (True, False):
                        values = counts.setdefault((task, k_name, temperature, grammar), Counter())
                        for seed in range(args.samples):
                            options = {"temperature": temperature, "seed": seed, "max_tokens": args.max_tokens}
                            value, n_prompt = ask(client, model, grammar=grammar, extra_body=extra_body, **options)
                            values[value] += 1
                            prompt_tokens.add(n_prompt)
                            if args.verbose:
                                kind = "grammar" if grammar else "free"
                                print(f"{task} {k_name} T={temperature} {kind} seed {seed}: {value!r}", flush=True)
                    if len(prompt_tokens) != 1:
                        raise SystemExit(f"{task}: the prompts differ ({sorted(prompt_tokens)} tokens)")
    report(counts, args.samples)


def report(counts: dict[tuple[str, str, float, bool], Counter[str]], n: int) -> None:
    print("\n| task | drafting | T | grammar: Paris | free: Paris | Fisher p | other values (grammar; free) |")
    print("|---|---|---|---|---|---|---|")
    for (task, k_name, temperature, grammar), values in counts.items():
        if not grammar:
            continue
        free = counts[(task, k_name, temperature, False)]
        p = fisher_p(values["Paris"], n, free["Paris"], n)
        others = [
            dict(Counter({v: c for v, c in side.items() if v != "Paris"}).most_common(4)) for side in (values, free)
        ]
        verdict = "same within noise" if p > 0.05 else "DIFFERENT"
        print(
            f"| {task} | {k_name} | {temperature} | {values['Paris']}/{n} | {free['Paris']}/{n} | {p:.3f} ({verdict})"
            f" | {others[0]}; {others[1]} |"
        )


if __name__ == "__main__":
    main()
