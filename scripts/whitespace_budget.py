"""What JSON's whitespace costs under a grammar, and whether a tighter allowance would change the answer's law
(issue 48, item 5).

The grammar lets the model write its own layout where JSON allows whitespace, bounded as llama.cpp bounds
it (`grammar.WHITESPACE`: nothing, a space, or one or two line breaks and an indent of up to 20). A
tighter allowance saves tokens only where the model would have written the whitespace it forbids, and
there it forces tokens the model would not write: the answer's law changes (values included: issue 37's
compact grammar cut "Paris" from 8 in 8 to 4-5). This measures both sides on the verifier (plain
decoding, in this process), for a JSON answer and a tool call's JSON (the Qwen template's tools prompt,
after `<tool_call>\\n`):

- tokens per answer under the current allowance and under each tighter one (the same seeds);
- of the answers sampled under the current allowance, how many a tighter one could not have produced
  (they left it: their law is not the tighter grammar's), and the largest mass one step put on
  whitespace the tighter one forbids;
- at T = 0: whether the greedy answer is the same under each.

A tighter allowance may be enabled only where the second line reads 0 of N and the mass is ~0: masking
tokens the model gives no mass changes nothing; masking any it does pushes it off its distribution.
Quiet machine only (the lead runs it); `--smoke` is a short check that it runs:

    .venv/bin/python scripts/whitespace_budget.py [-m VERIFIER.gguf] [--samples 16] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import specgguf.grammar as grammar  # noqa: E402
from specgguf.conversation import Message, Prompts  # noqa: E402
from specgguf.core.sampling import SamplingSettings, process_logits  # noqa: E402
from specgguf.files.assets import cache_dir  # noqa: E402
from specgguf.grammar import GrammarSpec, constraint_for  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

TIGHTER = {"one line": r"(?: )?", "indent <= 8": r"(?: |\n[ \t]{0,8})?"}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now.", "parameters": WEATHER}}
]


@contextlib.contextmanager
def whitespace(pattern: str) -> Iterator[None]:
    """Compile grammars with `pattern` as JSON's whitespace (the module's options, swapped for a while)."""
    before = grammar.JSON_OPTIONS
    grammar.JSON_OPTIONS = {**before, "whitespace_pattern": pattern}
    try:
        yield
    finally:
        grammar.JSON_OPTIONS = before


def tasks(model: LlamaModel) -> dict[str, tuple[list[int], dict]]:
    """Each task's prompt tokens and schema: a JSON answer, and a tool call's JSON after its opener."""
    prompts = Prompts(model)
    person = prompts.chat_tokens([Message("user", "Describe a fictional person as JSON: name, age and city.")])
    weather = prompts.chat_tokens([Message("user", "What is the weather in Paris?")], TOOLS)
    opener = model.tokenize("<tool_call>\n", special=True)
    opener = opener[1:] if opener and not model.token_bytes(opener[0]) else opener  # no BOS in the middle
    return {"json answer": (person, PERSON), "tool call": (weather + opener, CALL)}


def constrained(model: LlamaModel, schema: dict, pattern: str) -> Any:
    """The schema's constraint with `pattern` as JSON's whitespace."""
    with whitespace(pattern):
        return constraint_for(model, GrammarSpec.json_schema(schema))


def sample(model: LlamaModel, prompt: list[int], constraint: Any, *, temperature: float, seed: int, tighter=None):
    """One answer under `constraint` (plain decoding); with `tighter` (the same schema's, a tighter
    allowance), also whether the answer stayed inside it and the largest step's mass on what it forbids."""
    model.clear()
    logits = model.eval(prompt, n_logits=1)[0]
    rng = np.random.default_rng(seed)
    settings = SamplingSettings(temperature=temperature) if temperature > 0 else None
    tokens: list[int] = []
    inside, worst = tighter is not None, 0.0
    while len(tokens) < 256:
        allowed = constraint.allowed()
        masked = np.where(allowed, logits, -np.inf)
        if settings is None:
            probs, token = None, int(np.argmax(masked))
        else:
            probs = process_logits(masked, settings)[0]
            token = int(rng.choice(len(probs), p=probs))
        if inside:
            kept = tighter.allowed() & allowed
            if probs is not None:
                worst = max(worst, float(probs[~kept].sum()))
            inside = bool(kept[token])
            if inside:
                tighter.advance(token)
        if model.is_eog(token):
            break
        constraint.advance(token)
        tokens.append(token)
        logits = model.eval([token], n_logits=1)[0]
    text = b"".join(model.token_bytes(token) for token in tokens).decode("utf-8", "replace")
    return len(tokens), text, inside, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, default=cache_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--samples", type=int, default=16, help="seeded answers per task and allowance at T 0.8")
    parser.add_argument("--smoke", action="store_true", help="two samples, one task: does it run?")
    args = parser.parse_args()
    model = LlamaModel(args.model, n_ctx=1024)
    chosen = tasks(model)
    if args.smoke:
        args.samples, chosen = 2, dict(list(chosen.items())[:1])
    allowances = {"current": grammar.WHITESPACE, **TIGHTER}
    for task, (prompt, schema) in chosen.items():

        def answer(name: str, temperature: float, seed: int, tighter: str | None = None, prompt=prompt, schema=schema):
            under = None if tighter is None else constrained(model, schema, allowances[tighter])
            constraint = constrained(model, schema, allowances[name])
            return sample(model, prompt, constraint, temperature=temperature, seed=seed, tighter=under)

        greedy = {name: answer(name, 0.0, 0)[1] for name in allowances}
        print(f"{task}: greedy, current allowance: {greedy['current']!r}")
        counts = {name: [answer(name, 0.8, seed)[0] for seed in range(args.samples)] for name in allowances}
        for name in TIGHTER:
            runs = [answer("current", 0.8, seed, tighter=name) for seed in range(args.samples)]
            left = sum(not inside for _, _, inside, _ in runs)
            same = "the same" if greedy[name] == greedy["current"] else "differs: " + repr(greedy[name])
            print(
                f"  {name:>12}: {statistics.mean(counts[name]):.1f} tokens an answer against"
                f" {statistics.mean(counts['current']):.1f}; {left} of {args.samples} current answers left it,"
                f" the largest step's mass on what it forbids {max(w for *_, w in runs):.3g}; greedy {same}"
            )


if __name__ == "__main__":
    main()
