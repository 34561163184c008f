"""How each model family writes a tool call, as one table: the text that opens a call, the grammar of
one call (Lark, with the tool's JSON schema inline, for llguidance), and the parser that turns the
model's text back into OpenAI's tool calls. The family comes from the model's chat template.

- hermes (Qwen2.5, Hermes, ChatML without a template): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  (Qwen2.5-Coder also: a ```json block, or `{{"name": ..., "arguments": {...}}}` as its template shows it)
- llama3 (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` where it has one)
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["hermes", "llama3", "mistral"]


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
    lead: str = ""  # the start of the call's JSON that the opener already wrote ('{"name": "')


@dataclass(frozen=True)
class ToolSyntax:
    family: Family
    forms: tuple[Form, ...]  # the first is the family's own; others are what its models also write
    arguments_key: str  # "arguments" or "parameters"

    @property
    def opener(self) -> str:
        return self.forms[0].opener

    @property
    def openers(self) -> list[str]:
        return [form.opener for form in self.forms if form.opener]

    def call_lark(self, tools: list[Tool], special: Callable[[str], str], form: Form | None = None) -> str:
        """A Lark grammar (llguidance's dialect) for one call of any of `tools` in `form` (the
        family's own): its body after the opener, through the closer. `special(text)` spells text
        that may be a special token."""
        form = form or self.forms[0]
        rules, names = [], []
        before, after = form.before, form.after
        close = f" {special(form.closer)}" if form.closer else ""
        for i, tool in enumerate(tools):
            head = f'{before}{{"name": {json.dumps(tool.name)}, "{self.arguments_key}": '
            head = json.dumps(head.removeprefix(form.lead))
            tail = json.dumps("}" + after)
            rules.append(f"call_{i}: {head} args_{i} {tail}{close}")
            rules.append(f"args_{i}: %json {json.dumps(tool.parameters)}")
            names.append(f"call_{i}")
        return "\n".join([f"start: {' | '.join(names)}", *rules]) + "\n"

    def parse(self, region: str) -> list[ParsedCall]:
        """The calls in `region` (the text from the first opener on), the last maybe incomplete."""
        calls = []
        leads = {form.opener: form.lead for form in self.forms if form.opener}
        if leads:  # the split keeps each opener (a group), so a piece gets back its form's lead
            parts = re.split("(" + "|".join(map(re.escape, leads)) + ")", region)[1:]
            pieces = [leads[opener] + piece for opener, piece in zip(parts[::2], parts[1::2])]
        else:
            pieces = [region]
        for piece in pieces:
            start = piece.find("{")
            while start >= 0:
                call, end = _one_call(piece[start:], self.arguments_key)
                if call is None:
                    break
                calls.append(call)
                if not call.complete:
                    return calls
                start = piece.find("{", start + end)
        return calls


def _one_call(text: str, arguments_key: str) -> tuple[ParsedCall | None, int]:
    """`{"name": "N", "<key>": {...}}` at the start of text: (the call so far, where it ends)."""
    head = '{"name": '
    if not text.startswith(head):
        if head.startswith(text):
            return ParsedCall(None, "", False), len(text)
        return _loose(text, arguments_key)
    try:
        name, after = json.JSONDecoder().raw_decode(text, len(head))
    except json.JSONDecodeError:
        return ParsedCall(None, "", False), len(text)
    key = f', "{arguments_key}": '
    rest = text[after:]
    if not rest.startswith(key):
        return ParsedCall(str(name), "", False) if key.startswith(rest) else _loose(text, arguments_key)[0], len(text)
    arguments = rest[len(key) :]
    try:
        _, end = json.JSONDecoder().raw_decode(arguments)
    except json.JSONDecodeError:
        return ParsedCall(str(name), arguments, False), len(text)
    return ParsedCall(str(name), arguments[:end], True), after + len(key) + end


def _loose(text: str, arguments_key: str) -> tuple[ParsedCall | None, int]:
    """A call written without the grammar (other spacing, other key order): parsed whole, or not a call."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None, 0
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, 0
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    text_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedCall(value["name"], text_arguments, True), end


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
