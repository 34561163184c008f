"""OpenAI's Responses API over the same engine: POST /v1/responses (text in and out,
`instructions`, whole or as its streaming semantic events) and `previous_response_id` within the
server's memory (the last 256 stored responses). Errors are OpenAI's shape, as on the other /v1
routes. Tools wait for the tool-calling issue: a request with tools is a 400 naming them."""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from ...conversation import Message
from ...core.sampling import SamplingSettings
from ..common import AccountFields, ApiError, ServeOptions, parse_body, sampling_from, unsupported
from ..generator import Delta, Failed, Finished, Worker
from ..jobs import Answer, answer, messages, stream
from ..plan import GenerationRequest

MEMORY = 256  # stored responses a later request may continue from
_ROLES: dict[str, Literal["system", "user", "assistant"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


class Item(BaseModel):
    """An input item; only messages with text parts are read (others are refused by name)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str = "message"
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None


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
    text: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
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
        if self.tools:
            raise unsupported("tools", "no tool calls yet")
        fmt = (self.text or {}).get("format") or {"type": "text"}
        if fmt.get("type") != "text":
            raise unsupported("text.format", "plain text only")
        for name in ("background", "conversation", "prompt", "moderation", "context_management"):
            if getattr(self, name):
                raise unsupported(name)
        if self.top_logprobs:
            raise unsupported("top_logprobs", "use /v1/chat/completions for log-probabilities")

    def turns(self) -> list[Message]:
        if isinstance(self.input, str):
            return [Message("user", self.input)]
        return [_message(item, index) for index, item in enumerate(self.input)]

    def sampling(self, defaults: SamplingSettings) -> SamplingSettings:
        return sampling_from(defaults, temperature=self.temperature, top_p=self.top_p)


def _message(item: Item, index: int) -> Message:
    where = f"input[{index}]"
    if item.type != "message" or item.role not in _ROLES:
        what = item.type if item.type != "message" else f"role {item.role!r}"
        raise unsupported(f"{where}.type", f"only messages, not {str(what)[:40]}")
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


ENDPOINTS: tuple[str, ...] = ("/v1/responses",)
ERROR_PREFIXES: tuple[str, ...] = ("/v1/responses", "/responses")


def error_body(error: ApiError) -> dict:
    """OpenAI's error shape, as on the other /v1 routes."""
    return error.body()


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    memory: OrderedDict[str, list[Message]] = OrderedDict()

    @app.post("/v1/responses", dependencies=dependencies)
    @app.post("/responses", dependencies=dependencies)
    async def create(request: Request):
        body: ResponsesBody = parse_body(ResponsesBody, await request.body())
        if options.strict_model and body.model not in (None, options.model_name):
            raise ApiError(404, f"unknown model {str(body.model)[:200]!r}", param="model", code="model_not_found")
        history: list[Message] = []
        if body.previous_response_id is not None:
            if body.previous_response_id not in memory:
                raise ApiError(
                    400,
                    f"Previous response with id {body.previous_response_id[:100]!r} not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = [turn for turn in memory[body.previous_response_id] if turn.role != "system"]
        turns = history + body.turns()
        system = [Message("system", body.instructions)] if body.instructions else []
        generation = GenerationRequest(
            messages=system + turns,
            text="",
            max_tokens=body.max_output_tokens or options.max_tokens,
            settings=body.sampling(options.settings),
            seed=None,
            stops=[],
        )
        reply = await answer(worker, generation, request, stream=bool(body.stream))
        shape = _Shape(body, options.model_name)

        def remember(text: str) -> None:
            if body.store is not False:
                memory[shape.id] = [*turns, Message("assistant", text)]
                while len(memory) > MEMORY:
                    memory.popitem(last=False)

        if isinstance(reply, Answer):
            remember(reply.text)
            return shape.response(reply.text, reply.finished)
        return stream(_events(shape, reply, remember))


async def _events(shape: _Shape, job, remember):
    yield shape.event("response.created", response=shape.response("", None))
    yield shape.event("response.in_progress", response=shape.response("", None))
    yield shape.event("response.output_item.added", output_index=0, item=shape.item("", done=False))
    where = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
    yield shape.event("response.content_part.added", **where, part=shape.part(""))
    parts: list[str] = []
    async for message in messages(job):
        if isinstance(message, Delta):
            parts.append(message.text)
            yield shape.event("response.output_text.delta", **where, delta=message.text, logprobs=[])
        elif isinstance(message, Finished):
            text = "".join(parts)
            remember(text)
            yield shape.event("response.output_text.done", **where, text=text, logprobs=[])
            yield shape.event("response.content_part.done", **where, part=shape.part(text))
            yield shape.event("response.output_item.done", output_index=0, item=shape.item(text, done=True))
            final = shape.response(text, message)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield shape.event(kind, response=final)
        elif isinstance(message, Failed):
            yield shape.event("error", code="server_error", message=str(message.error), param=None)


class _Shape:
    def __init__(self, body: ResponsesBody, model: str):
        self.body, self.model = body, body.model or model
        self.id, self.item_id = "resp_" + secrets.token_hex(12), "msg_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.sequence = 0

    def part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, text: str, *, done: bool) -> dict:
        return {
            "id": self.item_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self.part(text)] if done else [],
        }

    def response(self, text: str, finished: Finished | None) -> dict:
        body = self.body
        incomplete = finished is not None and finished.finish_reason == "length"
        status = "in_progress" if finished is None else "incomplete" if incomplete else "completed"
        usage = None
        if finished is not None:
            usage = {
                "input_tokens": finished.n_prompt,
                "input_tokens_details": {"cached_tokens": finished.n_cached, "cache_write_tokens": 0},
                "output_tokens": finished.n_completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": finished.n_prompt + finished.n_completion,
            }
        shaped = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": [] if finished is None else [self.item(text, done=True)],
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store is not False,
            "temperature": body.temperature if body.temperature is not None else 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "truncation": "disabled",
            "metadata": body.metadata or {},
        }
        return shaped | ({"usage": usage} if usage else {}) | ({"user": body.user} if body.user else {})

    def event(self, kind: str, **data) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
