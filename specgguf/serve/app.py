"""`specgguf serve`: an HTTP server (FastAPI on uvicorn) over the same engine as `run`, speaking
OpenAI's API and others (apis/, one entry each).

`create_app` puts the guards in front (body limit, Host/Origin/Content-Type, request counting), the
API key check, /health, /metrics, the chat page at / (page/) and every API's routes; an error raised
anywhere becomes a JSON body in the shape of the API whose path it is. `run_server` loads the pair as
`run` does and serves until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import secrets
import socket
import threading

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from rich.console import Console
from rich.text import Text
from starlette.exceptions import HTTPException

from ..core.drafters import DRAFTER_KINDS
from ..core.sampling import SamplingSettings
from ..files.resolve import ResolvedPair
from ..llama.runtime import decode_on_one_thread
from ..prepare import MEASURING, DraftOptions, LoadOptions, Prepared, prepare
from .apis import APIS
from .common import ApiError, ServeOptions
from .generator import Worker
from .guard import Guard, HostPolicy, quiet_logs
from .jobs import ClientGone
from .page import routes as page
from .parallel.sizing import default_parallel, memory_available
from .transport import CONTENT_TYPE, BodyLimit, CountRequests, Metrics, Server, check_address, listen

# /health while the server loads (its grammar tables): llama-server's answer while it loads its model.
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def create_app(
    *,
    worker: Worker,
    options: ServeOptions,
    metrics: Metrics,
    bound: tuple[str, int] = ("127.0.0.1", 8080),
    ready: threading.Event | None = None,
) -> FastAPI:
    """The app; `ready`, once set, says the server is loaded (/health answers 503 until then)."""
    app = FastAPI(title="specgguf", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=options.max_body_bytes)
    policy = HostPolicy(bound[0], bound[1], options.allowed_hosts, options.cors_origins)
    app.add_middleware(Guard, policy=policy)  # Host, Origin, Content-Type: before any route
    endpoints = ("/health", "/metrics", *(endpoint for api in APIS for endpoint in api.ENDPOINTS))
    app.add_middleware(CountRequests, metrics=metrics, endpoints=endpoints)

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

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, error: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

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

    if options.webui:
        page.add_routes(app)  # the chat page at / (no key: the page asks for it)

    @app.get("/health")
    async def health():
        if ready is not None and not ready.is_set():
            return JSONResponse(LOADING, 503)  # a request sent now is answered, once the tables are built
        return {"status": "ok", "queue_length": worker.n_waiting}

    for api in APIS:  # each in its module over the same worker
        api.add_routes(app, worker=worker, options=options, dependencies=[Depends(check_key)])

    @app.get("/metrics", dependencies=[Depends(check_key)])
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    return app


def error_body(request: Request, error: ApiError) -> dict:
    """Each API answers errors in its own shape: the one whose prefixes the path starts with, else OpenAI's."""
    path = request.url.path
    return next((api.error_body(error) for api in APIS if path.startswith(api.ERROR_PREFIXES)), error.body())


def serve(
    *,
    worker: Worker,
    options: ServeOptions,
    sock: socket.socket,
    err_console: Console,
    ready: threading.Event | None = None,
) -> None:
    """Answer requests until Ctrl-C or SIGTERM; then stop the worker and return."""
    metrics = worker.metrics
    host, port = sock.getsockname()[:2]
    app = create_app(worker=worker, options=options, metrics=metrics, bound=(host, port), ready=ready)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5, lifespan="off")
    quiet_logs()  # after uvicorn set its logging up: one line per error, rate-limited
    shown_host = f"[{host}]" if ":" in host else host
    err_console.print(
        Text(
            f"specgguf serve · {options.model_name} · http://{shown_host}:{port}/v1"
            f"{' · API key required' if options.api_key else ''}"
            f"{f' · {options.concurrency}' if options.concurrency else ''} · Ctrl-C to stop",
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
    parallel: int | None = None,
    webui: bool = True,
    deterministic: bool = False,
) -> None:
    """Check the address, load the pair (the same set-up as `run`), then serve until stopped."""
    check_address(host, api_key=api_key, insecure=insecure)
    sock = listen(host, port)  # before loading: a taken port fails at once
    decode_on_one_thread()  # the requests' threads all decode (runtime.py says why on one thread)
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
        n_seq, memory = concurrency(prepared, parallel)
        worker = Worker(
            prepared=prepared,
            queue_size=queue_size,
            metrics=metrics,
            cache_slots=cache_slots,
            parallel=n_seq,
            deterministic=deterministic,
        )
        # The grammar tables, built as the server starts (not on a tool call's path): /health says 503, as
        # llama-server's does while it loads, until they are (about a second for 150k tokens).
        ready = threading.Event()
        threading.Thread(
            target=_grammar_tables, args=(prepared.verifier, ready), name="specgguf-tables", daemon=True
        ).start()
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
                concurrency=memory,
                webui=webui,
            ),
            sock=sock,
            err_console=err_console,
            ready=ready,
        )
        prepared.save_ngrams()  # the worker has stopped: nothing else touches the cache now
    finally:
        sock.close()


def concurrency(prepared: Prepared, parallel: int | None) -> tuple[int, str]:
    """How many requests run at once (--parallel, else what memory allows) and the startup line's
    words for it: the KV cache each live sequence costs, the verifier's and the draft's."""
    models = [model for model in (prepared.verifier, prepared.draft) if model is not None]
    per_sequence = sum(model.kv_bytes_per_sequence() for model in models)
    n_seq = parallel if parallel is not None else default_parallel(per_sequence, memory_available())
    if n_seq == 1:
        return 1, ""
    trees = " · draft trees off (they need --parallel 1)" if prepared.options.trees else ""
    size = f"{per_sequence / 2**20:.0f} MiB" if per_sequence >= 2**20 else f"{per_sequence / 2**10:.0f} KiB"
    return n_seq, f"{n_seq} requests at once ({size} of KV cache each){trees}"


def _grammar_tables(verifier: object, ready: threading.Event) -> None:
    from ..llama.guidance import grammar_tables  # llguidance loads only in a server
    from ..llama.model import LlamaModel

    try:
        if isinstance(verifier, LlamaModel):
            grammar_tables(verifier)
    except Exception:  # noqa: BLE001 - the request that needs a table builds it again and reports why
        return
    finally:
        ready.set()
