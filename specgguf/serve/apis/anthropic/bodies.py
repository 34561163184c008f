"""Anthropic's Messages request bodies: content blocks (text, `tool_use` in an assistant's turn,
`tool_result` in a user's), the conversation they make (`MessagesBody.history`), its tools
(`tool_plan`: `tools` with `input_schema`, `tool_choice` auto / any / tool / none) and its
structured output (`output_config.format`, or the beta's top-level `output_format`: a JSON schema).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ....conversation import Message, ToolCall
from ....core.sampling import SamplingSettings
from ....grammar import GrammarSpec
from ...common import ApiError, Body, checked_grammar, plan_tools, sampling_from, unsupported
from ...tools import Function, ToolPlan


class Block(BaseModel):
    """A content block: text, tool_use or tool_result; cache_control and citations are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None


def _text(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for index, block in enumerate(content):
        if block.type != "text" or block.text is None:
            raise unsupported(f"{where}[{index}].type", f"only text blocks here, not {block.type[:40]!r}")
        texts.append(block.text)
    return "\n".join(texts)


class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def turns(self, where: str, called: set[str]) -> list[Message]:
        """This message as the template's turns: an assistant's text and calls in one; a user's tool
        results one `tool` turn each (in order), then its text, if any."""
        if isinstance(self.content, str):
            return [Message(self.role, self.content)]
        texts, calls, results = [], [], []
        for index, block in enumerate(self.content):
            at = f"{where}[{index}]"
            if block.type == "text" and block.text is not None:
                texts.append(block.text)
            elif block.type == "tool_use" and self.role == "assistant":
                if block.id is None or block.name is None:
                    raise ApiError(400, f"{at}: a tool_use block needs 'id' and 'name'", param=at)
                called.add(block.id)
                calls.append(ToolCall(block.id, block.name, json.dumps(block.input or {}, ensure_ascii=False)))
            elif block.type == "tool_result" and self.role == "user":
                if block.tool_use_id not in called:
                    raise ApiError(
                        400,
                        f"{at} answers a tool_use no earlier assistant message made ({str(block.tool_use_id)[:64]!r})",
                        param=f"{at}.tool_use_id",
                    )
                text = _text(block.content or "", f"{at}.content")
                results.append(Message("tool", f"Error: {text}" if block.is_error else text, (), block.tool_use_id))
            else:
                raise unsupported(f"{at}.type", f"not a {block.type[:40]!r} block in a {self.role}'s message")
        text = "\n".join(texts)
        if self.role == "assistant":
            return [Message("assistant", text, tuple(calls))]
        return results + ([Message("user", text)] if texts or not results else [])


class AnthropicTool(BaseModel):
    """A tool the model may call (a client tool: Anthropic's server tools are refused)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    type: str | None = None  # "custom"
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonFormat(Body):
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(Body):
    effort: str | None = None  # ignored: a hint for Anthropic's models
    format: JsonFormat | None = None


class MessagesBody(Body):
    model: str
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)]
    system: str | list[Block] | None = None
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1, max_length=500)]], Field(max_length=16)] = []
    stream: bool | None = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    output_format: JsonFormat | None = None  # the structured-outputs beta's spelling
    # Accepted and ignored: nothing here for them to change.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    thinking: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None

    def refuse_unsupported(self) -> None:
        if self.thinking and self.thinking.get("type") != "disabled":
            raise unsupported("thinking", "no extended thinking")
        if self.mcp_servers:
            raise unsupported("mcp_servers", "no MCP connector")
        for index, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                raise unsupported(f"tools[{index}].type", f"client tools only, not {tool.type[:40]!r}")
            if tool.input_schema is None:
                raise ApiError(400, f"tools[{index}].input_schema is missing", param=f"tools[{index}].input_schema")
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise ApiError(400, "tool_choice.name is missing", param="tool_choice.name")
        if self.container is not None:
            raise unsupported("container")

    def history(self) -> list[Message]:
        turns = [Message("system", _text(self.system, "system"))] if self.system else []
        called: set[str] = set()
        for index, message in enumerate(self.messages):
            turns += message.turns(f"messages[{index}].content", called)
        return turns

    def grammar(self) -> GrammarSpec | None:
        """The structured output's grammar (a JSON schema), checked."""
        fmt = self.output_format or (self.output_config.format if self.output_config else None)
        if fmt is None:
            return None
        param = "output_format" if self.output_format else "output_config.format"
        return checked_grammar(GrammarSpec.json_schema(fmt.schema_, f"'{param}.schema'"), param)

    def tool_plan(self) -> ToolPlan | None:
        choice = self.tool_choice
        kind = None if choice is None else choice.type
        fmt = self.output_format or (self.output_config.format if self.output_config else None)
        return plan_tools(
            [
                Function(t.name, t.description, t.input_schema, f"tools[{i}].input_schema")
                for i, t in enumerate(self.tools or [])
            ],
            choice="required" if kind == "any" else None if kind == "tool" else kind,  # "tool": `named`
            named=choice.name if choice is not None and choice.type == "tool" else None,
            parallel=not (choice is not None and choice.disable_parallel_tool_use),
            called=[
                (block.name or "", f"messages[{i}].content[{j}].name")
                for i, message in enumerate(self.messages)
                if not isinstance(message.content, str)
                for j, block in enumerate(message.content)
                if block.type == "tool_use"
            ],
            conflicting="'output_config.format'" if fmt is not None else None,
        )

    def sampling(self, defaults: SamplingSettings) -> SamplingSettings:
        return sampling_from(defaults, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


class CountBody(MessagesBody):
    max_tokens: Annotated[int, Field(ge=1)] = 1  # count_tokens takes none
