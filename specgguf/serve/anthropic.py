"""Anthropic's Messages API over the same engine: POST /v1/messages (whole, or its streaming events
message_start ... message_stop) and POST /v1/messages/count_tokens. Text content, `system`,
`stop_sequences`, `temperature`/`top_k`/`top_p`; the key as `x-api-key` (or a Bearer header).
Errors are Anthropic's `{"type": "error", "error": {"type", "message"}}` (app.py shapes them)."""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..conversation import Message
from ..core.sampling import SamplingSettings
from .generator import Delta, Failed, Finished, GenerationRequest, Worker
from .jobs import ClientGone, messages, started, whole
from .protocol import ApiError, parse_body, unsupported

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: ApiError) -> dict:
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Block(BaseModel):
    """A content block: text is read; cache_control and citations are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


def _text(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for index, block in enumerate(content):
        if block.type != "text" or block.text is None:
            raise unsupported(f"{where}[{index}].type", f"only text blocks, not {block.type[:40]!r}")
        texts.append(block.text)
    return "\n".join(texts)


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class MessagesBody(_Body):
    model: str
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)]
    system: str | list[Block] | None = None
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1, max_length=500)]], Field(max_length=16)] = []
    stream: bool | None = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # Accepted and ignored: nothing here for them to change.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    output_config: dict[str, Any] | None = None  # its `effort` is ignored, a `format` refused
    thinking: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None

    def refuse_unsupported(self) -> None:
        if self.thinking and self.thinking.get("type") != "disabled":
            raise unsupported("thinking", "no extended thinking")
        for name in ("tools", "mcp_servers"):
            if getattr(self, name):
                raise unsupported(name, "no tool use")
        if self.tool_choice and self.tool_choice.get("type") not in ("auto", "none"):
            raise unsupported("tool_choice", "no tool use")
        if self.output_config and self.output_config.get("format") is not None:
            raise unsupported("output_config.format", "plain text only")
        if self.container is not None:
            raise unsupported("container")

    def history(self) -> list[Message]:
        turns = [Message("system", _text(self.system, "system"))] if self.system else []
        for index, message in enumerate(self.messages):
            turns.append(Message(message.role, _text(message.content, f"messages[{index}].content")))
        return turns

    def sampling(self, defaults: SamplingSettings) -> SamplingSettings:
        temperature = defaults.temperature if self.temperature is None else self.temperature
        top_p = defaults.top_p if self.top_p is None else self.top_p
        if top_p == 0.0:
            temperature, top_p = 0.0, 1.0
        return SamplingSettings(
            temperature=temperature,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            top_p=top_p,
            min_p=defaults.min_p,
            penalties=defaults.penalties,
        )


class CountBody(MessagesBody):
    max_tokens: Annotated[int, Field(ge=1)] = 1  # count_tokens takes none


def _stop(finished: Finished) -> dict:
    if finished.stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": finished.stop_string}
    return {"stop_reason": "end_turn" if finished.finish_reason == "stop" else "max_tokens", "stop_sequence": None}


def _usage(finished: Finished | None, n_prompt: int = 0) -> dict:
    if finished is None:
        return {"input_tokens": n_prompt, "output_tokens": 0}
    return {
        "input_tokens": finished.n_prompt - finished.n_cached,
        "output_tokens": finished.n_completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": finished.n_cached,
    }


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def add_routes(app: FastAPI, *, worker: Worker, options, dependencies: list) -> None:
    def errors(status: int, message: str) -> Exception:
        return ApiError(status, message)

    def parsed(body_type, raw: bytes):
        body = parse_body(body_type, raw)
        if options.strict_model and body.model != options.model_name:
            raise ApiError(404, f"model: {body.model[:200]}")
        return body

    @app.post("/v1/messages/count_tokens", dependencies=dependencies)
    async def count_tokens(request: Request):
        body: CountBody = parsed(CountBody, await request.body())
        return {"input_tokens": len(worker.templates.chat_tokens(body.history()))}

    @app.post("/v1/messages", dependencies=dependencies)
    async def create(request: Request):
        body: MessagesBody = parsed(MessagesBody, await request.body())
        generation = GenerationRequest(
            messages=body.history(),
            text="",
            max_tokens=body.max_tokens,
            settings=body.sampling(options.settings),
            seed=None,
            stops=list(body.stop_sequences),
        )
        receiver = await started(worker, generation, request, errors)
        message = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": body.model}
        if not body.stream:
            try:
                answer = await whole(receiver, errors)
            except ClientGone:
                return JSONResponse({}, 499)
            content = [{"type": "text", "text": answer.text}]
            return {**message, "content": content, **_stop(answer.finished), "usage": _usage(answer.finished)}
        receiver.close()

        async def events():
            start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(None)}
            yield _event("message_start", {"message": start})
            yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            yield _event("ping", {})
            async for item in messages(receiver.job):
                if isinstance(item, Delta):
                    yield _event(
                        "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": item.text}}
                    )
                elif isinstance(item, Finished):
                    yield _event("content_block_stop", {"index": 0})
                    yield _event("message_delta", {"delta": _stop(item), "usage": _usage(item)})
                    yield _event("message_stop", {})
                elif isinstance(item, Failed):
                    yield _event("error", error_body(ApiError(item.status, str(item.error))) | {"type": "error"})

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
