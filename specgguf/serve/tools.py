"""Tool calling in /v1/chat/completions: the request's checked tools (`ToolPlan`, made by OpenAI's
`ChatRequest.tool_plan`), the grammar that makes every call's arguments follow its tool's schema
(`call_constraint`: lazy, from the opener on, as llama-server's), and the model's text turned back
into OpenAI's tool calls, streamed as `delta.tool_calls` (`CallStream`). The syntax of each model
family: tool_syntax.py."""

from __future__ import annotations

import codecs
import copy
import json
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.lazy_grammar import LazyGrammar
from ..grammar import JSON_OPTIONS, GrammarSpec, GuidanceConstraint, check_schema
from .tool_syntax import SYNTAXES, Family, ParsedCall, Tool, ToolSyntax


@dataclass(frozen=True)
class ToolPlan:
    tools: list[Tool]
    definitions: list[dict]  # as the chat template reads them (OpenAI's shape)
    choice: str  # "auto", "required", "none", or the one function's name
    parallel: bool


def call_constraint(verifier: Any, tools_plan: ToolPlan, syntax: ToolSyntax) -> LazyGrammar | None:
    """The lazy grammar for this request's calls over the verifier's vocabulary: free text until the
    tokens of one of the family's openers, then that form's call grammar (tool_choice "required" or a
    named function: the first form's opener at once). None: nothing to constrain (a family without
    an opener, tool_choice "auto": the calls are parsed from the text)."""
    from ..llama.guidance import guidance_tokenizer

    tokenizer = guidance_tokenizer(verifier)
    forms = [form for form in syntax.forms if form.opener]
    openers = [_tokens(verifier, form.opener) for form in forms]
    if tools_plan.choice == "none":
        return _lazy(verifier, tokenizer, openers, None, required=False, parallel=False) if openers else None
    if not openers and tools_plan.choice == "auto":
        return None
    tools = [t for t in tools_plan.tools if tools_plan.choice in ("auto", "required", t.name)]
    strict = [Tool(t.name, t.description, _compact(t.parameters)) for t in tools]

    def special(text: str) -> str:
        ids = _tokens(verifier, text)
        return f"<[{ids[0]}]>" if len(ids) == 1 and tokenizer.is_special_token(ids[0]) else json.dumps(text)

    def factory(grammar: str):
        return lambda: GuidanceConstraint(tokenizer, grammar, verifier.n_vocab)

    grammars = [
        GrammarSpec("lark", syntax.call_lark(strict, special, form)).compile() for form in forms or syntax.forms
    ]
    required = tools_plan.choice != "auto"
    calls = [factory(grammar) for grammar in grammars]
    return _lazy(verifier, tokenizer, openers, calls, required=required, parallel=tools_plan.parallel)


def _tokens(verifier: Any, text: str) -> list[int]:
    tokens = verifier.tokenize(text, special=True)
    return tokens[1:] if len(tokens) > 1 and not verifier.token_bytes(tokens[0]) else tokens  # a BOS in front


def _lazy(verifier: Any, tokenizer, openers, calls, *, required: bool, parallel: bool) -> LazyGrammar:
    end = np.zeros(verifier.n_vocab, dtype=bool)
    between = np.zeros(verifier.n_vocab, dtype=bool)
    end[[token for token in tokenizer.eos_tokens if token < verifier.n_vocab]] = True  # every end-of-generation token
    for token in verifier.tokenize("\n", special=False)[-1:]:
        between[token] = True
    return LazyGrammar(
        n_vocab=verifier.n_vocab,
        openers=openers,
        calls=calls,
        end=end,
        between=between,
        required=required,
        parallel=parallel,
    )


def _compact(schema: dict) -> dict:
    """The schema as the call's grammar follows it: compact JSON (no free whitespace to wander in) and,
    as OpenAI's strict mode does, no properties beyond those an object lists (a small model invents
    keys otherwise); what it writes still validates against the schema as given."""
    schema = _closed(copy.deepcopy(check_schema(schema)))
    schema["x-guidance"] = {**JSON_OPTIONS, **schema.get("x-guidance", {})}
    return schema


def _closed(value: Any) -> Any:
    if isinstance(value, dict):
        if isinstance(value.get("properties"), dict) and "additionalProperties" not in value:
            value["additionalProperties"] = False
        for item in value.values():
            _closed(item)
    elif isinstance(value, list):
        for item in value:
            _closed(item)
    return value


class CallStream:
    """The model's text after the first opener, as OpenAI's tool calls: `feed` returns the new
    `delta.tool_calls` entries (a call's index, id and name first, then its argument fragments)."""

    def __init__(self, family: Family, token_bytes):
        self.syntax = SYNTAXES[family]
        self.token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything generated
        self.ids: list[str] = []
        self.sent: list[int] = []  # argument characters sent per call

    def region(self) -> str | None:
        """The text from the first call on; None while no call has opened."""
        if self.syntax.openers:
            found = [at for at in (self.text.find(opener) for opener in self.syntax.openers) if at >= 0]
            return self.text[min(found) :] if found else None
        stripped = self.text.lstrip()
        return stripped.removeprefix("<|python_tag|>") if stripped.startswith(("{", "<|python_tag|>")) else None

    @property
    def opened(self) -> bool:
        return self.region() is not None

    def feed(self, tokens: list[int]) -> list[dict]:
        for token in tokens:
            self.text += self._decoder.decode(self.token_bytes(token))
        region = self.region()
        return [] if region is None else self._deltas(self.syntax.parse(region))

    def _deltas(self, calls: list[ParsedCall]) -> list[dict]:
        deltas = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append("call_" + secrets.token_hex(12))
                self.sent.append(0)
                deltas.append(
                    {
                        "index": index,
                        "id": self.ids[index],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            if len(call.arguments) > self.sent[index]:
                deltas.append({"index": index, "function": {"arguments": call.arguments[self.sent[index] :]}})
                self.sent[index] = len(call.arguments)
        return deltas

    def calls(self) -> list[dict]:
        """The complete calls, OpenAI's `message.tool_calls`."""
        region = self.region()
        parsed = [] if region is None else [call for call in self.syntax.parse(region) if call.complete]
        while len(self.ids) < len(parsed):
            self.ids.append("call_" + secrets.token_hex(12))
        return [
            {"id": self.ids[i], "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for i, call in enumerate(parsed)
        ]
