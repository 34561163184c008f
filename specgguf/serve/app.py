"""`specgguf serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) over the same engine as `run`.

Routes parse and validate a request, hand a `GenerationRequest` to the single
worker thread (serve_engine), and shape what comes back into OpenAI's JSON or
server-sent events (serve_shapes). Every error is an OpenAI-style JSON body.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from dataclasses import dataclass

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from rich.console import Console
from rich.text import Text
from starlette.exceptions import HTTPException

from ..conversation import FimRequest
from ..core.drafters import DRAFTER_KINDS
from ..core.sampling import SamplingSettings
from ..files.resolve import ResolvedPair
from ..prepare import MEASURING, DraftOptions, KChoice, LoadOptions, parse_k, prepare
from . import anthropic, embeddings, infill, ollama, responses
from .generator import Delta, Failed, Finished, GenerationRequest, QueueFull, Worker
from .guard import Guard, HostPolicy, quiet_logs
from .jobs import ClientGone, Receiver
from .metrics import CONTENT_TYPE, Metrics
from .protocol import ApiError, ChatRequest, CompletionRequest, parse_body
from .shapes import Shape
from .tools import plan as tool_plan
from .transport import BodyLimit, CountRequests, Server, check_address, listen


@dataclass(frozen=True)
class ServeOptions:
    model_name: str
    max_tokens: int  # when a request gives none
    settings: SamplingSettings  # the defaults a request may override
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    allowed_hosts: tuple[str, ...] = ()  # Host values besides the bound address and localhost
    cors_origins: tuple[str, ...] = ()  # browser origins that may call the API
    strict_model: bool = False  # an unknown `model` is a 404 (else any name means the loaded model)


def create_app(
    *, worker: Worker, options: ServeOptions, metrics: Metrics, bound: tuple[str, int] = ("127.0.0.1", 8080)
) -> FastAPI:
    app = FastAPI(title="specgguf", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=options.max_body_bytes)
    policy = HostPolicy(bound[0], bound[1], options.allowed_hosts, options.cors_origins)
    app.add_middleware(Guard, policy=policy)  # Host, Origin, Content-Type: before any route
    app.add_middleware(CountRequests, metrics=metrics)
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        return JSONResponse(error_body(request, error), error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException):  # unknown routes, wrong methods
        return JSONResponse(
            error_body(request, ApiError(error.status_code, str(error.detail))),
            error.status_code,
            headers=getattr(error, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, error: Exception):  # never a traceback in a body
        bug = ApiError(500, f"internal error ({type(error).__name__})", kind="server_error")
        return JSONResponse(error_body(request, bug), 500)

    async def check_key(request: Request) -> None:
        if options.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
            token = request.headers.get("x-api-key", "")
        if not secrets.compare_digest(token.strip().encode(), options.api_key.encode()):
            raise ApiError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.get("/health")
    async def health():
        return {"status": "ok", "queue_length": worker.n_waiting}

    the_model = {"id": options.model_name, "object": "model", "created": created, "owned_by": "specgguf"}

    def route(method: str, path: str):
        """OpenAI's routes answer under /v1 and, as llama-server's do, without it."""

        def register(endpoint):
            for prefix in ("/v1", ""):
                app.add_api_route(prefix + path, endpoint, methods=[method], dependencies=[Depends(check_key)])
            return endpoint

        return register

    for api in (
        ollama,
        infill,
        anthropic,
        responses,
        embeddings,
    ):  # the other APIs, each in its module over the same worker
        api.add_routes(app, worker=worker, options=options, dependencies=[Depends(check_key)])

    @route("GET", "/models")
    async def models():
        return {"object": "list", "data": [the_model]}

    @route("GET", "/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != options.model_name:
            raise ApiError(404, f"unknown model {model_id[:200]!r}", param="model", code="model_not_found")
        return the_model

    @app.get("/metrics", dependencies=[Depends(check_key)])
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @route("POST", "/chat/completions")
    async def chat_completions(request: Request):
        body = parse_body(ChatRequest, await request.body())
        return await _answer(
            request,
            body,
            await asyncio.to_thread(_generation_request, body, body.template_messages(), "", options),
            Shape("chat", options.model_name, logprobs=body.n_top_logprobs is not None),
            worker=worker,
            options=options,
        )

    @route("POST", "/completions")
    async def completions(request: Request):
        body = parse_body(CompletionRequest, await request.body())
        return await _answer(
            request,
            body,
            await asyncio.to_thread(_generation_request, body, None, body.text, options),
            Shape("text", options.model_name, logprobs=body.n_top_logprobs is not None),
            worker=worker,
            options=options,
        )

    return app


# Each API answers errors in its own shape: the routes under these prefixes, the rest OpenAI's.
ERROR_SHAPES = (
    ("/api/", ollama.error_body),
    ("/infill", infill.error_body),
    ("/v1/messages", anthropic.error_body),
)


def error_body(request: Request, error: ApiError) -> dict:
    path = request.url.path
    return next((shape(error) for prefix, shape in ERROR_SHAPES if path.startswith(prefix)), error.body())


async def _answer(
    request: Request, body, generation: GenerationRequest, shape: Shape, *, worker: Worker, options: ServeOptions
):
    """Queue one request; answer it whole, or return the stream of its events."""
    if options.strict_model and body.model is not None and body.model != options.model_name:
        raise ApiError(
            404,
            f"unknown model {body.model[:200]!r}: this server serves {options.model_name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    try:
        job = worker.submit(generation, asyncio.get_running_loop())
    except QueueFull as error:
        raise ApiError(
            503,
            f"the server is busy: {error}; try again shortly",
            kind="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        ) from None
    receiver = Receiver(job, request)
    try:
        first = await receiver.next()
        if isinstance(first, Failed):
            raise ApiError(
                first.status, str(first.error), kind="invalid_request_error" if first.status < 500 else "server_error"
            )
        if body.stream:
            receiver.close()
            include_usage = body.stream_options is not None and bool(body.stream_options.include_usage)
            return StreamingResponse(
                _events(job, shape, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        parts, logprobs = [], []
        while isinstance(message := await receiver.next(), Delta):
            parts.append(message.text)
            logprobs += message.logprobs
        if isinstance(message, Failed):
            raise ApiError(message.status, str(message.error), kind="server_error")
        return JSONResponse(shape.response("".join(parts), message, logprobs))
    except ClientGone:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it
    finally:
        receiver.close()


async def _events(job, shape: Shape, include_usage: bool):
    """Server-sent events: OpenAI's chunks, then `data: [DONE]` (or an error event)."""
    try:
        yield shape.sse(shape.first_chunk(include_usage))
        while True:
            message = await job.messages.get()
            if isinstance(message, Delta):
                yield shape.sse(shape.chunk(message.text, message.logprobs, include_usage, message.tool_calls))
            elif isinstance(message, Finished):
                yield shape.sse(shape.last_chunk(message, include_usage))
                if include_usage:
                    yield shape.sse(shape.usage_chunk(message))
                yield "data: [DONE]\n\n"
                return
            else:
                yield shape.sse(ApiError(message.status, str(message.error), kind="server_error").body())
                return
    finally:
        job.cancelled.set()  # a client that hung up: the generation stops at its next step


def _generation_request(body, messages, text: str, options: ServeOptions) -> GenerationRequest:
    """(On a thread: a grammar's first compilation may take up to grammar.COMPILE_SECONDS.)"""
    speculative = body.speculative
    k = None
    if speculative is not None and speculative.k is not None:
        k = parse_k(speculative.k) if isinstance(speculative.k, str) else KChoice("fixed", speculative.k)
    return GenerationRequest(
        messages=messages,
        text=text,
        max_tokens=body.token_limit or options.max_tokens,
        settings=body.sampling(options.settings),
        seed=body.seed,
        stops=body.stop_strings,
        k=k,
        drafter=speculative.drafter if speculative else None,
        p_min=speculative.p_min if speculative else None,
        n_top_logprobs=body.n_top_logprobs,
        grammar=body.grammar_spec(),
        tools=tool_plan(body) if isinstance(body, ChatRequest) else None,
        prompt_tokens=getattr(body, "tokens", None),
        # A completion with a suffix fills in the middle (as Ollama and OpenAI's instruct models do).
        fim=FimRequest(text, body.suffix) if getattr(body, "suffix", None) is not None else None,
    )


def serve(*, worker: Worker, options: ServeOptions, sock: socket.socket, err_console: Console) -> None:
    """Answer requests until Ctrl-C or SIGTERM; then stop the worker and return."""
    metrics = worker.metrics
    host, port = sock.getsockname()[:2]
    app = create_app(worker=worker, options=options, metrics=metrics, bound=(host, port))
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5, lifespan="off")
    quiet_logs()  # after uvicorn set its logging up: one line per error, rate-limited
    shown_host = f"[{host}]" if ":" in host else host
    err_console.print(
        Text(
            f"specgguf serve · {options.model_name} · http://{shown_host}:{port}/v1"
            f"{' · API key required' if options.api_key else ''} · Ctrl-C to stop",
            style="dim",
        )
    )
    try:
        Server(config, on_exit=worker.stop).run(sockets=[sock])
    finally:
        worker.stop()
        worker.join(timeout=10)
        err_console.print(Text("specgguf serve: stopped", style="dim"))


def run_server(
    *,
    resolved: ResolvedPair,
    drafting: DraftOptions,
    load: LoadOptions,
    settings: SamplingSettings,
    max_tokens: int,
    host: str,
    port: int,
    api_key: str | None,
    insecure: bool,
    queue_size: int,
    max_body_bytes: int,
    err_console: Console,
    allowed_hosts: tuple[str, ...] = (),
    cors_origins: tuple[str, ...] = (),
    strict_model: bool = False,
    cache_slots: int = 4,
) -> None:
    """Check the address, load the pair (the same set-up as `run`), then serve until stopped."""
    check_address(host, api_key=api_key, insecure=insecure)
    sock = listen(host, port)  # before loading: a taken port fails at once
    try:
        prepared = prepare(
            resolved,
            load,
            drafting,
            keep_draft=True,  # a request may ask for drafting
            on_measure=lambda: err_console.print(MEASURING, style="dim"),
            on_announce=lambda text: err_console.print(text, style="dim"),
        )
        if prepared.draft is None and DRAFTER_KINDS[drafting.drafter].needs_model:
            err_console.print(
                "no draft model given (-md): decoding with the verifier alone unless a request"
                " asks for the n-gram drafter",
                style="yellow",
            )
        worker: Worker | None = None
        metrics = Metrics(lambda: worker.n_waiting if worker else 0)
        worker = Worker(prepared=prepared, queue_size=queue_size, metrics=metrics, cache_slots=cache_slots)
        name = resolved.label or resolved.name or resolved.verifier.stem
        serve(
            worker=worker,
            options=ServeOptions(
                model_name=name,
                max_tokens=max_tokens,
                settings=settings,
                api_key=api_key or None,
                max_body_bytes=max_body_bytes,
                allowed_hosts=allowed_hosts,
                cors_origins=cors_origins,
                strict_model=strict_model,
            ),
            sock=sock,
            err_console=err_console,
        )
        prepared.save_ngrams()  # the worker has stopped: nothing else touches the cache now
    finally:
        sock.close()
