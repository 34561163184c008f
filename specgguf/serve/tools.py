"""Tool calling in /v1/chat/completions: the request's checked tools (`ToolPlan`, made by OpenAI's
`ChatRequest.tool_plan`), the grammar that makes every call's arguments follow its tool's schema
(`call_constraint`: lazy, from the opener on, as llama-server's), and the model's text turned back
into OpenAI's tool calls, streamed as `delta.tool_calls` (`CallStream`: the content ends where a call
begins). tool_choice "none" is the plain answer: the tools are in the prompt, no grammar, nothing
parsed. The syntax of each model family: tool_syntax.py."""

from __future__ import annotations

import codecs
import copy
import json
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.lazy_grammar import LazyGrammar
from ..grammar import GrammarSpec, GuidanceConstraint, check_schema
from .text import AnswerText
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
    an opener, tool_choice "auto": the calls are parsed from the text; tool_choice "none")."""
    from ..llama.guidance import guidance_tokenizer

    forms = [form for form in syntax.forms if form.opener]
    if tools_plan.choice == "none" or (not forms and tools_plan.choice == "auto"):
        return None
    tokenizer = guidance_tokenizer(verifier)
    openers = [_tokens(verifier, form.opener) for form in forms]
    tools = [t for t in tools_plan.tools if tools_plan.choice in ("auto", "required", t.name)]
    strict = [Tool(t.name, t.description, _closed(copy.deepcopy(check_schema(t.parameters)))) for t in tools]

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


def _closed(value: Any) -> Any:
    """A schema as the call's grammar follows it: as OpenAI's strict mode does, no properties beyond
    those an object lists (a small model invents keys otherwise); what it writes still validates
    against the schema as given."""
    if isinstance(value, dict):
        if isinstance(value.get("properties"), dict) and "additionalProperties" not in value:
            value["additionalProperties"] = False
        for item in value.values():
            _closed(item)
    elif isinstance(value, list):
        for item in value:
            _closed(item)
    return value


def call_stream(tools_plan: ToolPlan | None, family: Family, token_bytes) -> CallStream | None:
    """What reads the request's calls from the answer; None without tools or for tool_choice "none"."""
    if tools_plan is None or tools_plan.choice == "none":
        return None
    return CallStream(family, token_bytes, names=[tool.name for tool in tools_plan.tools])


class CallStream:
    """The model's text from its first call on, as OpenAI's tool calls: `feed` returns the new
    `delta.tool_calls` entries (a call's index, id and name first, then its argument fragments),
    `content` what of the text is the answer's content, `result` how the answer ends."""

    def __init__(self, family: Family, token_bytes, names: list[str] | None = None):
        self.syntax = SYNTAXES[family]
        self.token_bytes = token_bytes
        self.names = names  # the tools': JSON naming another is no call
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything generated
        self.ids: list[str] = []
        self.sent: list[int] = []  # argument characters sent per call
        self.released = 0  # characters of text the answer released (stop strings settled)
        self.shown = 0  # ... and shown as content
        self.cut = False  # the answer was cut short (max_tokens), known at its end

    def start(self) -> int | None:
        """Where the first call begins (or may, the text ending in what could open one); None: no call."""
        return self.syntax.call_start(self.text, self.names)

    def region(self) -> str | None:
        """The text from the first call on; None while no call has begun."""
        start = self.start()
        return None if start is None else self.text[start:]

    @property
    def opened(self) -> bool:
        return self.start() is not None

    def feed(self, tokens: list[int]) -> list[dict]:
        for token in tokens:
            self.text += self._decoder.decode(self.token_bytes(token))
        region = self.region()
        return [] if region is None else self._deltas(self._parsed(region))

    def _parsed(self, region: str) -> list[ParsedCall]:
        return self.syntax.parse(region, self.names)

    def content(self, released: str, *, final: bool = False) -> str:
        """Of `released` (the answer's text the stop strings let out), what the client sees as content
        now: the text before the first call (held back while one may be starting). At the end
        (`final`), text that began like a call but held none is content after all."""
        self.released += len(released)
        start, end = self.start(), self.released
        if start is not None:
            end = min(end, start)
            if final and not self.result()[1]:  # no call after all: its text too (to a stop string)
                at_opener = any(self.text.startswith(opener, start) for opener in self.syntax.openers)
                end = len(self.text) if at_opener else self.released
        shown = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return shown

    def finish(self, answer: AnswerText, stop: str | None) -> str:
        """The answer ended (`stop`: the engine's reason, "eos" or "max_tokens"): the last content."""
        self.text += self._decoder.decode(b"", final=True)
        self.cut = stop != "eos" and not (answer.stopped and answer.matched not in self.syntax.openers)
        return self.content(answer.finish(), final=True)

    def result(self) -> tuple[str | None, list[dict]]:
        """How the answer ends: a finish reason for its calls (None: no call, the answer's own) and
        OpenAI's `message.tool_calls`. A call cut short (max_tokens) ends the answer as "length" with
        its arguments so far, as OpenAI does; whole calls as "tool_calls"."""
        region = self.region()
        parsed = [] if region is None else self._parsed(region)
        if self.cut and region is not None and (not parsed or not parsed[-1].complete):
            return "length", self._whole([call for call in parsed if call.name is not None])
        complete = [call for call in parsed if call.complete]
        return ("tool_calls", self._whole(complete)) if complete else (None, [])

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

    def _whole(self, parsed: list[ParsedCall]) -> list[dict]:
        while len(self.ids) < len(parsed):
            self.ids.append("call_" + secrets.token_hex(12))
        return [
            {"id": self.ids[i], "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for i, call in enumerate(parsed)
        ]
