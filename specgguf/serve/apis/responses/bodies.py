"""The Responses API's request body: input items (messages with text parts, `function_call` items
an assistant made, `function_call_output` items answering them) as the conversation's turns, its
function tools (`tools`, `tool_choice`, planned as every API's are) and `text.format` (json_object
or json_schema, through the same grammar as chat completions' response_format)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ....conversation import Message, ToolCall
from ....core.sampling import SamplingSettings
from ....grammar import GrammarSpec
from ...common import AccountFields, ApiError, checked_grammar, plan_tools, sampling_from, unsupported
from ...tools import Function, ToolPlan

_ROLES: dict[str, Literal["system", "user", "assistant"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


class Item(BaseModel):
    """An input item: a message with text parts, a function_call or a function_call_output (others
    are refused by name)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str = "message"
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None
    arguments: str | None = None
    output: str | list[dict[str, Any]] | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the grammar enforces the schema either way


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    format: TextFormat | None = None
    verbosity: str | None = None  # ignored: a hint for OpenAI's models


class ResponsesBody(AccountFields):
    model: str | None = None
    input: str | list[Item] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    text: TextOptions | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None  # ignored: a hint for OpenAI's reasoning models
    truncation: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    moderation: Any = None
    context_management: Any = None

    def refuse_unsupported(self) -> None:
        for index, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise unsupported(f"tools[{index}].type", f"function tools only, not {tool.type[:40]!r}")
            if not tool.name:
                raise ApiError(400, f"tools[{index}].name is missing", param=f"tools[{index}].name")
        if isinstance(self.tool_choice, dict) and (
            self.tool_choice.get("type") != "function" or not isinstance(self.tool_choice.get("name"), str)
        ):
            raise unsupported("tool_choice", 'a function\'s choice is {"type": "function", "name": ...}')
        for name in ("background", "conversation", "prompt", "moderation", "context_management"):
            if getattr(self, name):
                raise unsupported(name)
        if self.top_logprobs:
            raise unsupported("top_logprobs", "use /v1/chat/completions for log-probabilities")

    @property
    def format(self) -> TextFormat:
        return (self.text.format if self.text else None) or TextFormat()

    def grammar(self) -> GrammarSpec | None:
        fmt = self.format
        if fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return GrammarSpec("json_object")
        if fmt.schema_ is None:
            raise ApiError(400, "'text.format.schema' is missing", param="text.format.schema")
        return checked_grammar(GrammarSpec.json_schema(fmt.schema_, "'text.format.schema'"), "text.format")

    def tool_plan(self, history: list[Message]) -> ToolPlan | None:
        """The request's tools, checked; `history` (the stored turns this continues) may hold calls too."""
        choice = self.tool_choice
        items = [] if isinstance(self.input, str) else self.input
        return plan_tools(
            [
                Function(tool.name or "", tool.description, tool.parameters, f"tools[{i}].parameters")
                for i, tool in enumerate(self.tools or [])
            ],
            choice=choice if isinstance(choice, str) else None,
            named=choice["name"] if isinstance(choice, dict) else None,
            parallel=self.parallel_tool_calls is not False,
            called=[(call.name, "previous_response_id") for turn in history for call in turn.tool_calls]
            + [(item.name or "", f"input[{i}].name") for i, item in enumerate(items) if item.type == "function_call"],
            conflicting="'text.format'" if self.format.type != "text" else None,
        )

    def turns(self, history: list[Message]) -> list[Message]:
        """The input as turns: function_call items join the assistant turn before them (or make one),
        each function_call_output is a `tool` turn answering a call made before it."""
        if isinstance(self.input, str):
            return [Message("user", self.input)]
        turns: list[Message] = []
        called = {call.id for turn in history for call in turn.tool_calls}
        for index, item in enumerate(self.input):
            where = f"input[{index}]"
            if item.type == "function_call":
                if item.call_id is None or item.name is None or item.arguments is None:
                    raise ApiError(400, f"{where}: a function_call needs call_id, name and arguments", param=where)
                call = ToolCall(item.call_id, item.name, item.arguments)
                called.add(item.call_id)
                if turns and turns[-1].role == "assistant":
                    last = turns.pop()
                    turns.append(Message("assistant", last.content, (*last.tool_calls, call)))
                else:
                    turns.append(Message("assistant", "", (call,)))
            elif item.type == "function_call_output":
                if item.call_id not in called:
                    raise ApiError(
                        400,
                        f"{where} answers a function call no earlier item made ({str(item.call_id)[:64]!r})",
                        param=f"{where}.call_id",
                    )
                turns.append(Message("tool", _output(item.output, where), (), item.call_id))
            else:
                turns.append(_message(item, index))
        return turns

    def sampling(self, defaults: SamplingSettings) -> SamplingSettings:
        return sampling_from(defaults, temperature=self.temperature, top_p=self.top_p)


def _output(output: str | list[dict[str, Any]] | None, where: str) -> str:
    if isinstance(output, str):
        return output
    texts = []
    for index, part in enumerate(output or []):
        if part.get("type") != "input_text" or not isinstance(part.get("text"), str):
            raise unsupported(f"{where}.output[{index}].type", "only text output")
        texts.append(part["text"])
    return "\n".join(texts)


def _message(item: Item, index: int) -> Message:
    where = f"input[{index}]"
    if item.type != "message" or item.role not in _ROLES:
        what = item.type if item.type != "message" else f"role {item.role!r}"
        raise unsupported(f"{where}.type", f"only messages and function calls, not {str(what)[:40]}")
    if isinstance(item.content, str):
        return Message(_ROLES[item.role], item.content)
    texts = []
    for part_index, part in enumerate(item.content or []):
        kind = part.get("type")
        text = part.get("refusal") if kind == "refusal" else part.get("text")
        if kind not in ("input_text", "output_text", "text", "refusal") or not isinstance(text, str):
            raise unsupported(f"{where}.content[{part_index}].type", f"only text, not {str(kind)[:40]!r}")
        texts.append(text)
    return Message(_ROLES[item.role], "\n".join(texts))
