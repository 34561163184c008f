"""Anthropic's Messages API over the same engine: POST /v1/messages (whole, or its streaming events
message_start ... message_stop) and POST /v1/messages/count_tokens. Text content, `system`,
`stop_sequences`, `temperature`/`top_k`/`top_p`, tools (`tool_use` blocks in the answer, with
`stop_reason: "tool_use"`; `tool_result` blocks in the history) and structured output (a JSON
schema): the request bodies are in bodies.py. The key as `x-api-key` (or a Bearer header).
Errors are Anthropic's `{"type": "error", "error": {"type", "message"}}` (`error_body`)."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from pydantic_core import from_json

from ....conversation import ToolCall
from ...common import ApiError, ServeOptions, check_model, parse_body
from ...generator import Delta, Failed, Finished, Job, Worker
from ...jobs import Answer, answer, failure, messages, set_up, stream
from ...plan import GenerationRequest, Limits, RequestPrompt, RequestSampling
from ...tools import CallDelta
from .bodies import CountBody, MessagesBody

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


ENDPOINTS: tuple[str, ...] = ("/v1/messages", "/v1/messages/count_tokens")
ERROR_PREFIXES: tuple[str, ...] = ("/v1/messages",)


def error_body(error: ApiError) -> dict:
    """Anthropic's error shape."""
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _stop(finished: Finished) -> dict:
    if finished.stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": finished.stop_string}
    reasons = {"stop": "end_turn", "tool_calls": "tool_use"}
    return {"stop_reason": reasons.get(finished.finish_reason, "max_tokens"), "stop_sequence": None}


def _usage(finished: Finished) -> dict:
    return {
        "input_tokens": finished.n_prompt - finished.n_cached,
        "output_tokens": finished.n_completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": finished.n_cached,
    }


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _tool_use(call: ToolCall) -> dict:
    """A call as a tool_use block. One cut by max_tokens is kept, as Anthropic keeps it, its input
    what of its JSON is whole (read as the SDK reads a stream's partial JSON)."""
    try:
        arguments = from_json(call.arguments, allow_partial=True)
    except ValueError:  # cut before its first brace
        arguments = {}
    input_ = arguments if isinstance(arguments, dict) else {}
    return {"type": "tool_use", "id": _tool_id(call.id), "name": call.name, "input": input_}


def _content(text: str, calls: list[ToolCall]) -> list[dict]:
    """The answer's blocks: its text (none when only blank text comes before calls), then its calls."""
    return ([{"type": "text", "text": text}] if text.strip() or not calls else []) + [_tool_use(c) for c in calls]


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    def served(name: str) -> None:
        check_model(options, name, lambda shown: ApiError(404, f"model: {shown}"))  # Anthropic's not_found_error

    @app.post("/v1/messages/count_tokens", dependencies=dependencies)
    async def count_tokens(request: Request):
        body = parse_body(CountBody, await request.body())
        served(body.model)
        tools = await set_up(body.tool_plan)  # its grammars compile off the event loop
        tokens = worker.templates.chat_tokens(body.history(), None if tools is None else tools.in_prompt)
        return {"input_tokens": len(tokens)}

    @app.post("/v1/messages", dependencies=dependencies)
    async def create(request: Request):
        body = parse_body(MessagesBody, await request.body())
        served(body.model)
        # Off the event loop: a grammar's first compilation may take up to grammar.COMPILE_SECONDS.
        grammar, tools = await set_up(lambda: (body.grammar(), body.tool_plan()))
        generation = GenerationRequest(
            RequestPrompt(body.history()),
            RequestSampling(body.sampling(options.settings)),
            Limits(body.max_tokens, list(body.stop_sequences)),
            grammar=grammar,
            tools=tools,
        )
        reply = await answer(worker, generation, request, stream=bool(body.stream))
        message = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": body.model}
        if isinstance(reply, Answer):
            content = _content(reply.text, reply.finished.tool_calls)
            return {**message, "content": content, **_stop(reply.finished), "usage": _usage(reply.finished)}
        return stream(_events(reply, message))


async def _events(job: Job, message: dict) -> AsyncIterator[str]:
    """message_start, the content blocks (text, tool_use) as they come, message_delta, message_stop."""
    started = job.started
    n_prompt, n_cached = (started.n_prompt, started.n_cached) if started is not None else (0, 0)
    usage = {"input_tokens": n_prompt - n_cached, "output_tokens": 0, "cache_read_input_tokens": n_cached}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    yield _event("message_start", {"message": start})
    yield _event("ping", {})
    blocks = _Blocks()
    async for item in messages(job):
        if isinstance(item, Delta):
            for event in blocks.text(item.text):
                yield event
            for delta in item.tool_calls:
                for event in blocks.call(delta):
                    yield event
        elif isinstance(item, Finished):
            for event in blocks.close():
                yield event
            yield _event("message_delta", {"delta": _stop(item), "usage": _usage(item)})
            yield _event("message_stop", {})
        elif isinstance(item, Failed):
            yield _event("error", error_body(failure(item)) | {"type": "error"})


class _Blocks:
    """The stream's content blocks, numbered as they open: a text block when text comes (blank text
    held back until more follows, dropped if a call comes next), a tool_use block per call."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use"
        self.blank = ""  # blank text not yet sent

    def _start(self, block: dict) -> list[str]:
        events = self._stop()
        self.index += 1
        self.open = block["type"]
        return [*events, _event("content_block_start", {"index": self.index, "content_block": block})]

    def _stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"index": self.index})]

    def text(self, text: str) -> list[str]:
        if not text:
            return []
        if not (self.blank + text).strip():
            self.blank += text
            return []
        events = self._start({"type": "text", "text": ""}) if self.open != "text" else []
        delta = {"type": "text_delta", "text": self.blank + text}
        self.blank = ""
        return [*events, _event("content_block_delta", {"index": self.index, "delta": delta})]

    def call(self, delta: CallDelta) -> list[str]:
        events = []
        if delta.id is not None:
            self.blank = ""
            events = self._start({"type": "tool_use", "id": _tool_id(delta.id), "name": delta.name, "input": {}})
        if delta.arguments:
            json_delta = {"type": "input_json_delta", "partial_json": delta.arguments}
            events.append(_event("content_block_delta", {"index": self.index, "delta": json_delta}))
        return events

    def close(self) -> list[str]:
        """The end: blank text not yet sent (or an empty text block, if nothing was said); the last block stops."""
        events = []
        if self.blank:
            blank, self.blank = self.blank, ""
            events = self._start({"type": "text", "text": ""}) if self.open != "text" else []
            delta = {"type": "text_delta", "text": blank}
            events.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
        elif self.index < 0:
            events = self._start({"type": "text", "text": ""})
        return [*events, *self._stop()]
