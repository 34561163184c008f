"""Tool calling, for every API that has it: the request's checked tools (`plan_tools` makes a
`ToolPlan` from API-neutral `Function`s and a choice; each API reads its own field shapes into
them), the grammar that makes every call's arguments follow its tool's schema (`call_constraint`:
lazy, from the opener on, as llama-server's), and the model's text turned back into calls
(`CallStream`: the content ends where a call begins) as API-neutral values — `CallDelta` pieces
while streaming, `conversation.ToolCall`s whole — that each API shapes its own way. tool_choice
"none" is the plain answer: the prompt without the tools, no grammar, nothing parsed. The syntax
of each model family: tool_syntax.py."""

from __future__ import annotations

import codecs
import contextlib
import copy
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..conversation import ToolCall
from ..core.json_digits import DigitBound
from ..core.lazy_grammar import LazyGrammar
from ..errors import UsageError
from ..grammar import GrammarError, GrammarSpec, GuidanceConstraint, check_schema, check_together, number_bounds
from .text import AnswerText
from .tool_syntax import CALL_START, SYNTAXES, Family, ParsedCall, Tool, ToolSyntax


@dataclass(frozen=True)
class ToolPlan:
    tools: list[Tool]
    definitions: list[dict]  # as the chat template reads them (OpenAI's shape)
    choice: str  # "auto", "required", "none", or the one function's name
    parallel: bool

    @property
    def in_prompt(self) -> list[dict] | None:
        """The tools as the chat template gets them: none for tool_choice "none", whose answer is
        text (a model shown tools it may not call writes the call as text anyway)."""
        return None if self.choice == "none" else self.definitions


@dataclass(frozen=True)
class Function:
    """A tool definition as any API gives it; `param` says where (for the error that names it)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None  # a JSON schema; None: any object
    param: str  # e.g. "tools[0].function.parameters", "tools[0].input_schema"

    @property
    def schema(self) -> dict[str, Any]:
        """Its parameters' schema (no parameters: any object)."""
        return self.parameters if self.parameters is not None else {"type": "object"}


class ToolsError(UsageError):
    """A request's tools that cannot be planned; `param` names the request's field (each API says it
    in its own error shape)."""

    def __init__(self, message: str, *, param: str, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names (Anthropic's is narrower)


def plan_tools(
    functions: Sequence[Function],
    *,
    choice: str | None,
    named: str | None = None,
    parallel: bool = True,
    called: Sequence[tuple[str, str]] = (),
    conflicting: str | None = None,
) -> ToolPlan | None:
    """The request's tools, checked: each name is a function name and unique, each schema compiles,
    the choice (`choice` "auto", "none", "required" or None; `named` one function) names one of
    them, the history calls only them (`called`: each call's name and where). `conflicting`: the
    name of the request's other constraint (a response format), refused beside tools. None: no
    tools (or tool_choice "none" without tools)."""
    if not functions:
        if named is not None or choice == "required":
            raise ToolsError("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if conflicting is not None:
        raise ToolsError(f"'tools' cannot be combined with {conflicting}", param="tools")
    tools = []
    check_together(_schemas(functions))  # their first compilations in one child (each compile below reads its own)
    for function in functions:
        if not _NAME.match(function.name):
            raise ToolsError(
                f"{function.name[:70]!r} is not a function name (1 to 64 of A-Z a-z 0-9 _ . -)",
                param=function.param.rpartition(".")[0] + ".name",  # beside its parameters
            )
        try:
            _schema(function).compile()
        except GrammarError as error:
            raise ToolsError(
                f"{error} (tool {function.name!r})", param=function.param, code="invalid_tool_schema"
            ) from None
        tools.append(Tool(function.name, function.description, function.schema))
    names = [tool.name for tool in tools]
    if len(set(names)) < len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ToolsError(f"two tools are named {duplicate!r}", param="tools")
    if named is not None and named not in names:
        raise ToolsError(f"'tool_choice' names {named[:64]!r}, which is not in 'tools'", param="tool_choice")
    for name, where in called:
        if name not in names:
            raise ToolsError(f"a message calls an unknown tool {name[:64]!r} (not in 'tools')", param=where)
    definitions = [  # OpenAI's shape, which chat templates read
        {"type": "function", "function": _defined(function)} for function in functions
    ]
    return ToolPlan(tools, definitions, named or choice or "auto", parallel)


def _schema(function: Function) -> GrammarSpec:
    """A function's parameters as a grammar (no parameters: any object); GrammarError if they are no schema."""
    return GrammarSpec.json_schema(function.schema, f"'{function.param}'")


def _schemas(functions: Sequence[Function]) -> list[GrammarSpec]:
    """The functions' grammars that are schemas at all (the others are refused in plan_tools' order)."""
    specs = []
    for function in functions:
        with contextlib.suppress(GrammarError):
            specs.append(_schema(function))
    return specs


def _defined(function: Function) -> dict[str, Any]:
    defined: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        defined["description"] = function.description
    if function.parameters is not None:
        defined["parameters"] = function.parameters
    return defined


@dataclass(frozen=True)
class CallDelta:
    """A streamed piece of the answer's `index`-th call: its id and name first (once, with no
    arguments), then fragments of its arguments' JSON text."""

    index: int
    id: str | None
    name: str | None
    arguments: str


def call_constraint(verifier: Any, tools_plan: ToolPlan, syntax: ToolSyntax) -> LazyGrammar | None:
    """The lazy grammar for this request's calls over the verifier's vocabulary: free text until the
    tokens of one of the family's openers, then that form's call grammar (tool_choice "required" or a
    named function: the first form's opener at once). None: nothing to constrain (a family without
    an opener, tool_choice "auto": the calls are parsed from the text; tool_choice "none")."""
    from ..llama.guidance import guidance_tokenizer, token_texts

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

    texts, bounds = token_texts(verifier), number_bounds([tool.parameters for tool in strict])

    def factory(grammar: str):  # the arguments' numbers bounded in digits, as an answer's (core/json_digits.py)
        return lambda: DigitBound(GuidanceConstraint(tokenizer, grammar, verifier.n_vocab), texts, bounds)

    specs = [GrammarSpec("lark", syntax.call_lark(strict, special, form)) for form in forms or syntax.forms]
    check_together(specs)  # one child for every form's grammar
    grammars = [spec.compile() for spec in specs]
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
    """The model's text from its first call on, as calls: `feed` returns the new `CallDelta`s (a
    call's index, id and name first, then its argument fragments),
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

    def feed(self, tokens: list[int]) -> list[CallDelta]:
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
            at_opener = any(self.text.startswith(opener, start) for opener in self.syntax.openers)
            # No call after all: its text too (to a stop string); but a call cut before its name came
            # is a call that got no further ("length"), its markup no content.
            begun = at_opener or self._named_so_far(start)
            if final and not self.result()[1] and not (self.cut and begun):
                end = len(self.text) if at_opener else self.released
        shown = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return shown

    def _named_so_far(self, start: int) -> bool:
        """Whether the text from `start` is a call's JSON whose name so far begins a tool's name."""
        match = CALL_START.match(self.text, start)
        if match is None or not self.text.startswith('"', match.end()):
            return False
        so_far = self.text[match.end() + 1 :]
        return self.names is None or any(name.startswith(so_far) for name in self.names)

    def finish(self, answer: AnswerText, stop: str | None) -> str:
        """The answer ended (`stop`: the engine's reason, "eos" or "max_tokens"): the last content."""
        self.text += self._decoder.decode(b"", final=True)
        self.cut = stop != "eos" and not (answer.stopped and answer.matched not in self.syntax.openers)
        return self.content(answer.finish(), final=True)

    def result(self) -> tuple[str | None, list[ToolCall]]:
        """How the answer ends: a finish reason for its calls (None: no call, the answer's own) and
        the calls. A call cut short (max_tokens) ends the answer as "length" with
        its arguments so far, as OpenAI does (cut before its name: no call, and none of its text as
        content); whole calls as "tool_calls"."""
        region = self.region()
        parsed = [] if region is None else self._parsed(region)
        if self.cut and region is not None and (not parsed or not parsed[-1].complete):
            return "length", self._whole([call for call in parsed if call.name is not None])
        complete = [call for call in parsed if call.complete]
        return ("tool_calls", self._whole(complete)) if complete else (None, [])

    def _deltas(self, calls: list[ParsedCall]) -> list[CallDelta]:
        deltas = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append("call_" + secrets.token_hex(12))
                self.sent.append(0)
                deltas.append(CallDelta(index, self.ids[index], call.name, ""))
            if len(call.arguments) > self.sent[index]:
                deltas.append(CallDelta(index, None, None, call.arguments[self.sent[index] :]))
                self.sent[index] = len(call.arguments)
        return deltas

    def _whole(self, parsed: list[ParsedCall]) -> list[ToolCall]:
        while len(self.ids) < len(parsed):
            self.ids.append("call_" + secrets.token_hex(12))
        return [ToolCall(self.ids[i], call.name or "", call.arguments) for i, call in enumerate(parsed)]
