"""OpenAI's API: chat and text completions and the models list, under /v1 and, as llama-server's routes,
without it. The routes are here, and the response shapes (`Shape`: whole, or as stream chunks, built
from the worker's `Finished` message, with llama-server's `timings`, common.py); the request bodies in
bodies.py, the fields accepted and ignored, or refused by name, in fields.py. Errors are OpenAI's shape
(`ApiError.body`), the server's default for every path that no other API claims. (The Responses API and
embeddings are OpenAI's too: responses/, embeddings.py.)
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import replace
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ....conversation import FimRequest, Message, ToolCall
from ...common import ApiError, ServeOptions, Speculative, check_model, parse_body, timings, usage
from ...draft_marks import Span
from ...generator import Delta, Finished, Job, Worker
from ...jobs import Answer, answer, failure, messages, set_up, stream
from ...plan import GenerationRequest, Limits, RequestPrompt, RequestSampling
from ...text import TokenLogprob
from ...tools import CallDelta
from .bodies import ChatRequest, CompletionRequest

ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/v1/models")
ERROR_PREFIXES: tuple[str, ...] = ()  # the default: every path no other API claims


def error_body(error: ApiError) -> dict:
    return error.body()


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    created = int(time.time())
    the_model = {"id": options.model_name, "object": "model", "created": created, "owned_by": "specgguf"}

    def route(method: str, path: str):
        """OpenAI's routes answer under /v1 and, as llama-server's do, without it."""

        def register(endpoint):
            for prefix in ("/v1", ""):
                app.add_api_route(prefix + path, endpoint, methods=[method], dependencies=dependencies)
            return endpoint

        return register

    @route("GET", "/models")
    async def models():
        return {"object": "list", "data": [the_model]}

    @route("GET", "/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != options.model_name:
            raise ApiError(404, f"unknown model {model_id[:200]!r}", param="model", code="model_not_found")
        return the_model

    @route("POST", "/chat/completions")
    async def chat_completions(request: Request):
        body = parse_body(ChatRequest, await request.body())
        return await _answer(
            request,
            body,
            # Off the event loop: a grammar's first compilation may take up to grammar.COMPILE_SECONDS.
            await set_up(
                lambda: _generation_request(body, body.template_messages(), "", options, worker.verifier.n_ctx)
            ),
            Shape("chat", options.model_name, logprobs=body.n_top_logprobs is not None, marks=body.marks_drafts),
            worker=worker,
            options=options,
        )

    @route("POST", "/completions")
    async def completions(request: Request):
        body = parse_body(CompletionRequest, await request.body())
        return await _answer(
            request,
            body,
            await set_up(lambda: _generation_request(body, None, body.text, options, worker.verifier.n_ctx)),
            Shape("text", options.model_name, logprobs=body.n_top_logprobs is not None, marks=body.marks_drafts),
            worker=worker,
            options=options,
        )


async def _answer(
    request: Request,
    body: ChatRequest | CompletionRequest,
    generation: GenerationRequest,
    shape: Shape,
    *,
    worker: Worker,
    options: ServeOptions,
):
    """Queue one request; answer it whole, or return the stream of its events."""
    check_model(options, body.model)
    reply = await answer(worker, generation, request, stream=bool(body.stream))
    if isinstance(reply, Answer) and body.warm_up:  # n_predict 0: the prompt is read, nothing answered
        reply = Answer("", replace(reply.finished, n_completion=0, tool_calls=[], finish_reason="length"), [])
    if isinstance(reply, Answer):
        return JSONResponse(shape.response(reply.text, reply.finished, reply.logprobs))
    include_usage = body.stream_options is not None and bool(body.stream_options.include_usage)
    return stream(_events(reply, shape, include_usage))


async def _events(job: Job, shape: Shape, include_usage: bool):
    """Server-sent events: OpenAI's chunks, then `data: [DONE]` (or an error event)."""
    yield shape.sse(shape.first_chunk(include_usage))
    async for message in messages(job):
        if isinstance(message, Delta):
            yield shape.sse(
                shape.chunk(message.text, message.logprobs, include_usage, message.tool_calls, message.spans)
            )
        elif isinstance(message, Finished):
            yield shape.sse(shape.last_chunk(message, include_usage))
            if include_usage:
                yield shape.sse(shape.usage_chunk(message))
            yield "data: [DONE]\n\n"
        else:
            yield shape.sse(failure(message).body())


def _generation_request(
    body: ChatRequest | CompletionRequest,
    messages: list[Message] | None,
    text: str,
    options: ServeOptions,
    n_ctx: int,
) -> GenerationRequest:
    completion = body if isinstance(body, CompletionRequest) else None
    prompt = RequestPrompt(
        messages,
        text,
        tokens=None if completion is None else completion.tokens,
        # A completion with a suffix fills in the middle (as Ollama and OpenAI's instruct models do).
        fim=FimRequest(text, completion.suffix) if completion is not None and completion.suffix is not None else None,
        parse_special=completion is not None,  # a completions prompt is raw model input; chat content is text
    )
    return GenerationRequest(
        prompt,
        RequestSampling(body.sampling(options.settings, n_ctx), body.seed, body.n_top_logprobs),
        Limits(body.token_limit or options.max_tokens, body.stop_strings),
        (body.speculative or Speculative()).speculation(mark_drafts=body.marks_drafts),
        grammar=body.grammar_spec(),
        tools=body.tool_plan() if isinstance(body, ChatRequest) else None,
    )


# OpenAI's backend configuration id (a string in its schema): the server and its version.
SYSTEM_FINGERPRINT = "fp_specgguf_0.1"


class Shape:
    """One response's id and envelope; `kind` "chat" (/v1/chat/completions) or "text" (/v1/completions)."""

    def __init__(self, kind: Literal["chat", "text"], model: str, *, logprobs: bool = False, marks: bool = False):
        self.kind, self.model, self.logprobs = kind, model, logprobs
        self.marks = marks  # chunks carry `specgguf`: spans by writer, and the whole stats at the end
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self._text_offset = 0  # where the next token starts in the text (the legacy logprobs' text_offset)

    def _logprobs(self, entries: list[TokenLogprob]) -> dict | None:
        """OpenAI's two shapes: chat's list of token objects, the legacy completions' parallel lists."""
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {
                "content": [
                    {
                        **_token(entry.token, entry.logprob),
                        "top_logprobs": [_token(token, logprob) for token, logprob in entry.top],
                    }
                    for entry in entries
                ],
                "refusal": None,
            }
        offsets = []
        for entry in entries:
            offsets.append(self._text_offset)
            self._text_offset += len(_text(entry.token))
        return {
            "tokens": [_text(entry.token) for entry in entries],
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [{_text(token): logprob for token, logprob in entry.top} for entry in entries],
            "text_offset": offsets,
        }

    def _envelope(self, *, chunk: bool, choices: list[dict]) -> dict:
        if self.kind == "chat":
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }

    def _choice(
        self,
        text: str | None,
        finish_reason: str | None,
        *,
        chunk: bool,
        role: bool = False,
        logprobs: list[TokenLogprob] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        shaped = self._logprobs(logprobs) if logprobs is not None else None
        if self.kind == "text":
            return {"index": 0, "text": text or "", "logprobs": shaped, "finish_reason": finish_reason}
        if not chunk:
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
            if tool_calls:  # OpenAI's content beside calls: null unless the model wrote text first
                message.update(content=text if text and text.strip() else None, tool_calls=tool_calls)
            return {"index": 0, "message": message, "logprobs": shaped, "finish_reason": finish_reason}
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        delta |= ({} if text is None else {"content": text}) | ({"tool_calls": tool_calls} if tool_calls else {})
        return {"index": 0, "delta": delta, "logprobs": shaped, "finish_reason": finish_reason}

    def response(self, text: str, finished: Finished, logprobs: list[TokenLogprob]) -> dict:
        calls = [_call(call) for call in finished.tool_calls]
        choice = self._choice(text, finished.finish_reason, chunk=False, logprobs=logprobs, tool_calls=calls)
        return {**self._envelope(chunk=False, choices=[choice]), "usage": usage(finished), "timings": timings(finished)}

    def _chunk(self, choices: list[dict], include_usage: bool) -> dict:
        body = self._envelope(chunk=True, choices=choices)
        return {**body, "usage": None} if include_usage else body

    def first_chunk(self, include_usage: bool) -> dict:
        """Chat streams open with the assistant's role (OpenAI does); text streams with empty text."""
        return self._marked(self._chunk([self._choice("", None, chunk=True, role=True)], include_usage), [])

    def chunk(
        self,
        text: str,
        logprobs: list[TokenLogprob],
        include_usage: bool,
        tool_calls: list[CallDelta] | None = None,
        spans: list[Span] | None = None,
    ) -> dict:
        shown = None if tool_calls and not text else text
        deltas = [_call_delta(delta) for delta in tool_calls or []]
        body = self._chunk([self._choice(shown, None, chunk=True, logprobs=logprobs, tool_calls=deltas)], include_usage)
        return self._marked(body, spans or [])

    def last_chunk(self, finished: Finished, include_usage: bool) -> dict:
        """The finish reason, with llama-server's `timings` (its streams carry them on the last chunk)."""
        body = {
            **self._chunk([self._choice(None, finished.finish_reason, chunk=True)], include_usage),
            "timings": timings(finished),
        }
        return self._marked(body, [], stats=finished.stats.as_dict())

    def _marked(self, body: dict, spans: list[Span], **more) -> dict:
        """`mark_drafts`: specgguf's own object beside OpenAI's fields, on every chunk with a choice."""
        shaped = [{"text": span.text, "source": span.source} for span in spans]
        return {**body, "specgguf": {"spans": shaped, **more}} if self.marks else body

    def usage_chunk(self, finished: Finished) -> dict:
        """`stream_options.include_usage`: one more chunk, with no choices and the usage."""
        return {**self._envelope(chunk=True, choices=[]), "usage": usage(finished)}

    @staticmethod
    def sse(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def _token(token: bytes, logprob: float) -> dict:
    return {"token": _text(token), "logprob": logprob, "bytes": list(token)}


def _call(call: ToolCall) -> dict:
    """A whole call, as `message.tool_calls` lists it."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _call_delta(delta: CallDelta) -> dict:
    """A piece of a call, as `delta.tool_calls` streams it: index, id and name first, then arguments."""
    if delta.id is not None:
        function = {"name": delta.name, "arguments": delta.arguments}
        return {"index": delta.index, "id": delta.id, "type": "function", "function": function}
    return {"index": delta.index, "function": {"arguments": delta.arguments}}
