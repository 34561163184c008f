"""Structured output and tool calls with the default pair, through a live `specgguf serve` and the openai SDK:
every json_schema answer must validate against its schema, every tool call's arguments must parse and
validate against its tool's schema (the issue's target: 100%, on >= 20 prompts each).

    .venv/bin/python scripts/structured_validation.py            # all prompts (about 75 s on 2 cores)
    .venv/bin/python scripts/structured_validation.py --only 3   # a smoke run

Prints one line per answer and a table: answers, valid, finish reasons, and accepted drafts by source
(the grammar's forced tokens are source "grammar"). Exit status 1 if anything failed to validate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
from openai import OpenAI

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "field": {"type": "string"}},
    "required": ["name", "born", "field"],
    "additionalProperties": False,
}
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population_millions": {"type": "number"},
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city", "country", "population_millions", "landmarks"],
    "additionalProperties": False,
}
FUNCTION: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
        "arguments": {"type": "array", "items": {"type": "string"}},
        "returns": {"enum": ["int", "str", "bool", "list", "dict", "None"]},
        "complexity": {"enum": ["O(1)", "O(log n)", "O(n)", "O(n log n)", "O(n^2)"]},
    },
    "required": ["name", "arguments", "returns", "complexity"],
    "additionalProperties": False,
}
SCHEMA_PROMPTS = (
    [
        (PERSON, f"Describe {who} as JSON.")
        for who in (
            "Ada Lovelace",
            "Alan Turing",
            "Grace Hopper",
            "Guido van Rossum",
            "Linus Torvalds",
            "Marie Curie",
            "Dennis Ritchie",
        )
    ]
    + [
        (CITY, f"Give facts about {city} as JSON.")
        for city in ("Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Toronto", "Nairobi")
    ]
    + [
        (FUNCTION, f"Describe a Python function that {task}, as JSON.")
        for task in (
            "reverses a string",
            "checks whether a number is prime",
            "sorts a list of numbers",
            "counts the words in a text",
            "merges two dictionaries",
            "finds the maximum of a list",
            "computes a factorial",
        )
    ]
)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run Python code and return its output",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
]
TOOL_PROMPTS = [
    "What's the weather in Paris?",
    "Is it raining in London right now?",
    "How hot is it in Cairo, in fahrenheit?",
    "Weather in Tokyo and in Osaka, please.",
    "Should I take an umbrella in Seattle today?",
    "Search the web for the latest Python release.",
    "Find news about the James Webb telescope.",
    "Look up three recipes for pancakes.",
    "Search for the population of Brazil.",
    "Who won the 2022 World Cup? Search.",
    "Compute 2**100 with Python.",
    "Run Python to list the first 10 primes.",
    "Use Python to reverse 'hello world'.",
    "What is 17 factorial? Use Python.",
    "Sort [5, 3, 9, 1] using Python.",
    "What's the weather in Rome?",
    "Search the web for 'speculative decoding'.",
    "Run python: print(sum(range(101)))",
    "Weather in Oslo in celsius?",
    "Find the tallest building in the world with a web search.",
    "Check the weather in Nairobi.",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(extra: list[str]):
    """`specgguf serve` (the default pair unless -m/-md in `extra`) on a free port; its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "specgguf", "serve", "--port", str(port), *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if process.poll() is not None:
                raise SystemExit(f"the server exited ({process.returncode})")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def add_sources(total: Counter, response) -> None:
    total.update(response.model_extra["timings"].get("draft_n_accepted_by_source", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, help="the first N prompts of each set")
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("-n", "--max-tokens", type=int, default=200)
    args, extra = parser.parse_known_args()
    schema_prompts, tool_prompts = SCHEMA_PROMPTS[: args.only], TOOL_PROMPTS[: args.only]
    rows: list[tuple[str, int, int, Counter[str], Counter[str]]] = []
    with server(extra) as url:
        client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        valid, finish, sources = 0, Counter[str](), Counter[str]()
        for schema, prompt in schema_prompts:
            response = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                temperature=args.temp,
                max_tokens=args.max_tokens,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": True},
                },
            )
            text, ok = response.choices[0].message.content or "", True
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError):
                ok = False
            valid += int(ok)
            finish[response.choices[0].finish_reason] += 1
            add_sources(sources, response)
            print(f"{'ok ' if ok else 'BAD'} json_schema  {prompt[:50]!r}: {text[:90]}")
        rows.append(("json_schema", len(schema_prompts), valid, finish, sources))
        valid, finish, sources = 0, Counter[str](), Counter[str]()
        schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
        n_calls = 0
        for prompt in tool_prompts:
            response = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                temperature=args.temp,
                max_tokens=args.max_tokens,
                tools=TOOLS,
            )
            message, ok = response.choices[0].message, True
            calls = [call.function for call in message.tool_calls or [] if call.type == "function"]
            for call in calls:
                n_calls += 1
                try:
                    jsonschema.validate(json.loads(call.arguments), schemas[call.name])
                except (ValueError, KeyError, jsonschema.ValidationError):
                    ok = False
            valid += int(ok)
            finish[response.choices[0].finish_reason] += 1
            add_sources(sources, response)
            shown = [(call.name, call.arguments) for call in calls] or message.content
            print(f"{'ok ' if ok else 'BAD'} tools        {prompt[:50]!r}: {str(shown)[:90]}")
        rows.append((f"tool calls ({n_calls} calls)", len(tool_prompts), valid, finish, sources))
    print("\n| set | answers | valid | finish reasons | accepted drafts by source |\n|---|---|---|---|---|")
    for name, n, n_valid, reasons, by_source in rows:
        print(f"| {name} | {n} | {n_valid}/{n} | {dict(reasons)} | {dict(by_source)} |")
    sys.exit(0 if all(n_valid == n for _, n, n_valid, _, _ in rows) else 1)


if __name__ == "__main__":
    main()
