"""How each model family writes a tool call, as one table: the text that opens a call, the grammar of
one call (Lark, with the tool's JSON schema inline, for llguidance), and the parser that turns the
model's text back into OpenAI's tool calls. The family comes from the model's chat template.

- hermes (Qwen2.5, Hermes, ChatML without a template): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  (Qwen2.5-Coder also: a ```json block, or `{{"name": ..., "arguments": {...}}}` as its template shows it)
- llama3 (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` where it has one)
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`

The grammar and the parser both take the model's own layout: one line, pretty-printed, or bare and
fenced for the parser (as llama-server's parser reads calls), whatever the family's own form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from ..grammar import JSON_OPTIONS, WHITESPACE, bound_integers

Family = Literal["hermes", "llama3", "mistral"]
# Around a call's JSON (after `<tool_call>`, before `</tool_call>`, inside a fence or `[…]`): nothing, a
# space, or one or two line breaks, as templates write it; no indent.
AROUND_CALL = r"(?: |\n{1,2})?"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ParsedCall:
    name: str | None  # None until the name is complete
    arguments: str  # the arguments' JSON text so far (all of it once `complete`)
    complete: bool


@dataclass(frozen=True)
class Form:
    """One way a family writes a call: opener, then before + the call's JSON + after, then closer."""

    opener: str  # "" : none, the call is the answer's start
    before: str = ""
    after: str = ""
    closer: str = ""  # may be a special token
    lead: str = ""  # the start of the call's JSON the opener already wrote, up to its name ('{"name": "')


# A call's JSON as models write it, whatever their layout (one line, pretty-printed): its name first.
CALL_START = re.compile(r'\{\s*"name"\s*:\s*')
ARGUMENTS_KEY = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
MAYBE_CALL_START = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?\Z')  # text ending where one may begin


@dataclass(frozen=True)
class ToolSyntax:
    family: Family
    forms: tuple[Form, ...]  # the first is the family's own; others are what its models also write
    arguments_key: str  # "arguments" or "parameters"

    @property
    def openers(self) -> list[str]:
        return [form.opener for form in self.forms if form.opener]

    def call_lark(self, tools: list[Tool], special: Callable[[str], str], form: Form | None = None) -> str:
        """A Lark grammar (llguidance's dialect) for one call of any of `tools` in `form` (the
        family's own): its body after the opener, through the closer. `special(text)` spells text
        that may be a special token. The call's JSON follows the tool's schema with the model's own
        whitespace (grammar.JSON_OPTIONS). What wraps it (`<tool_call>\\n{…}\\n</tool_call>`) takes
        AROUND_CALL: no indent, which a model sampling at T > 0 could run to 20 spaces the client
        never sees but is billed for."""
        form = form or self.forms[0]
        wrap = [json.dumps(piece) for piece in form.after.split()] + ([special(form.closer)] if form.closer else [])
        after = " ".join(f"AROUND? {piece}" for piece in wrap)
        rules = [f"WS: /{WHITESPACE}/", f"AROUND: /{AROUND_CALL}/"]
        if form.lead:  # the opener wrote the call up to its name: the rest, by hand, arguments as %json
            assert form.lead == '{"name": "', form.lead
            names = []
            for i, tool in enumerate(tools):
                name = json.dumps(tool.name + '"')
                key = json.dumps(f'"{self.arguments_key}"')
                rules.append(f'call_{i}: {name} WS? "," WS? {key} WS? ":" WS? args_{i} WS? "}}"')
                rules.append(f"args_{i}: %json {json.dumps(_with_options(tool.parameters))}")
                names.append(f"call_{i}")
            return "\n".join([f"start: ({' | '.join(names)}) {after}", *rules]) + "\n"
        before = " ".join(["AROUND?", *(f"{json.dumps(piece)} AROUND?" for piece in form.before.split())])
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, self.arguments_key: tool.parameters},
                "required": ["name", self.arguments_key],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        rules.append(f"call: %json {json.dumps(_with_options({'anyOf': calls}))}")
        return "\n".join([f"start: {before} call {after}".rstrip(), *rules]) + "\n"

    def call_start(self, text: str, names: Collection[str] | None = None) -> int | None:
        """Where the first call in `text` begins: an opener, or a call's JSON written bare (anywhere,
        as llama-server's parser takes it), or where the text ends in what may still open one; None:
        no call. With `names`, JSON naming none of them is not a call."""
        found = [at for at in (text.find(opener) for opener in self.openers) if at >= 0]
        for match in CALL_START.finditer(text):
            if _one_call(text, match.end(), self.arguments_key, names)[0] is not None:
                found.append(match.start())
                break
        if maybe := MAYBE_CALL_START.search(text):
            found.append(maybe.start())
        return min(found, default=None)

    def parse(self, region: str, names: Collection[str] | None = None) -> list[ParsedCall]:
        """The calls in `region` (the text from the first call on), the last maybe incomplete (an
        unnamed one: a call has begun, its name has not come). With `names`, JSON naming none of
        them is skipped."""
        calls: list[ParsedCall] = []
        at = 0
        for match in CALL_START.finditer(region):
            if match.start() < at:
                continue
            call, end = _one_call(region, match.end(), self.arguments_key, names)
            if call is None:
                continue
            calls.append(call)
            if not call.complete:
                return calls
            at = end
        rest = region[at:]
        if any(opener in rest for opener in self.openers) or MAYBE_CALL_START.search(rest):
            calls.append(ParsedCall(None, "", False))
        return calls


def _with_options(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema as the top of a %json (its integers bounded, grammar.bound_integers): llguidance reads
    its whitespace options there only."""
    return {**bound_integers(schema), "x-guidance": {**schema.get("x-guidance", {}), **JSON_OPTIONS}}


def _one_call(text: str, at: int, arguments_key: str, names: Collection[str] | None) -> tuple[ParsedCall | None, int]:
    """The call whose name's value starts at `at` (after `{"name": `): (the call so far, where it
    ends), or (None, at) where this JSON is no call (its name is not a string or not a tool's, no
    arguments follow it)."""
    if at == len(text):
        return ParsedCall(None, "", False), at
    if text[at] != '"':
        return None, at
    try:
        name, after = json.JSONDecoder().raw_decode(text, at)
    except json.JSONDecodeError:
        return ParsedCall(None, "", False), len(text)
    if names is not None and name not in names:
        return None, at
    key = ARGUMENTS_KEY.match(text, after)
    if key is None:
        rest = "".join(text[after:].split())
        if rest.startswith("}"):  # a call without arguments (a tool that takes none)
            return ParsedCall(name, "{}", True), text.index("}", after) + 1
        if any(f',"{word}":'.startswith(rest) for word in (arguments_key, "arguments", "parameters")):
            return ParsedCall(name, "", False), len(text)
        return None, at
    try:
        arguments, end = json.JSONDecoder().raw_decode(text, key.end())
    except json.JSONDecodeError:  # not complete yet: what came so far (a string's only when whole)
        so_far = text[key.end() :]
        return ParsedCall(name, "" if so_far.startswith('"') else so_far, False), len(text)
    whole = arguments if isinstance(arguments, str) else text[key.end() : end]
    return ParsedCall(name, whole, True), end


SYNTAXES: dict[Family, ToolSyntax] = {
    syntax.family: syntax
    for syntax in (
        # Qwen2.5-Coder often writes its call as a ```json block instead, llama.cpp's parser takes it
        # too; or bare, in the doubled braces its own template shows it (`{{"name": <function-name>, …}}`).
        ToolSyntax(
            "hermes",
            (
                Form("<tool_call>", "\n", "\n", "</tool_call>"),
                Form("```json\n", "", "\n```"),
                Form('{{"name": "', "", "}", lead='{"name": "'),
            ),
            "arguments",
        ),
        ToolSyntax("llama3", (Form(""),), "parameters"),
        ToolSyntax("mistral", (Form("[TOOL_CALLS]", "[", "]"),), "arguments"),
    )
}


def family_of(template: str | None) -> Family:
    """The tool-call syntax a chat template teaches its model (hermes where it says nothing)."""
    if template and "[TOOL_CALLS]" in template:
        return "mistral"
    if template and ("<|python_tag|>" in template or "<|eom_id|>" in template):
        return "llama3"
    return "hermes"
