"""Ollama's chat messages with tools: the history's `tool_calls` (arguments an object, ids optional)
and `tool` messages, the request's `tools` planned as every API's are (tools.plan_tools), and the
answer's calls shaped as Ollama's `message.tool_calls`."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ....conversation import Message, ToolCall
from ...common import Body, plan_tools
from ...tools import Function, ToolPlan


class CalledFunction(Body):
    name: str
    arguments: dict[str, Any] | str = {}
    index: int | None = None


class OllamaToolCall(Body):
    function: CalledFunction
    id: str | None = None
    type: str | None = None


class OllamaMessage(Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class OllamaFunction(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class OllamaTool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"] = "function"
    function: OllamaFunction


def history(messages: list[OllamaMessage]) -> list[Message]:
    """The conversation; calls without ids get some, and a tool message answers the earliest call
    not yet answered (of its `tool_name`, when it gives one)."""
    turns, waiting = [], list[ToolCall]()
    for i, message in enumerate(messages):
        calls = tuple(
            ToolCall(
                call.id or f"call_{i}_{j}",
                call.function.name,
                call.function.arguments
                if isinstance(call.function.arguments, str)
                else json.dumps(call.function.arguments, ensure_ascii=False),
            )
            for j, call in enumerate(message.tool_calls or [])
        )
        waiting += calls
        answered = None
        if message.role == "tool":
            answered = message.tool_call_id or next(
                (c.id for c in waiting if message.tool_name in (None, c.name)), f"call_{i}"
            )
            waiting = [call for call in waiting if call.id != answered]
        turns.append(Message(message.role, message.content or "", calls, answered))
    return turns


def tool_plan(tools: list[OllamaTool], messages: list[OllamaMessage], *, conflicting: str | None) -> ToolPlan | None:
    return plan_tools(
        [
            Function(t.function.name, t.function.description, t.function.parameters, f"tools[{i}].function.parameters")
            for i, t in enumerate(tools)
        ],
        choice=None,
        called=[
            (call.function.name, f"messages[{i}].tool_calls[{j}].function.name")
            for i, message in enumerate(messages)
            for j, call in enumerate(message.tool_calls or [])
        ],
        conflicting=conflicting,
    )


def tool_calls(calls: list[ToolCall]) -> list[dict]:
    """The answer's calls as Ollama's `message.tool_calls` (arguments an object; one cut short, whose
    arguments are no JSON object, is left out)."""
    shaped = []
    for index, call in enumerate(calls):
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            continue
        if isinstance(arguments, dict):
            shaped.append({"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}})
    return shaped
