"""OpenAI's API: chat and text completions and the models list, under /v1 and, as llama-server's
routes, without it. The routes are here; the request bodies in bodies.py, the fields accepted and
ignored, or refused by name, in fields.py, the response shapes (whole, or as stream chunks) in
shapes.py. Errors are OpenAI's shape (`ApiError.body`), the server's default for every path that no
other API claims. (The Responses API and embeddings are OpenAI's too: responses/, embeddings.py.)
"""

from __future__ import annotations

import time
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ....conversation import FimRequest, Message
from ...common import ApiError, ServeOptions, Speculative, check_model, parse_body
from ...generator import Delta, Finished, Job, Worker
from ...jobs import Answer, answer, failure, messages, set_up, stream
from ...plan import GenerationRequest, Limits, RequestPrompt, RequestSampling
from .bodies import ChatRequest, CompletionRequest
from .shapes import Shape

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
