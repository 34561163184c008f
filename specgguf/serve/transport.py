"""The server's transport pieces around the FastAPI app: body-size limit, request counting and the
counts `GET /metrics` shows (`Metrics`), a uvicorn server that stops cleanly on signals, and the address
checks."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import UsageError
from .common import ApiError

CONTENT_TYPE = CONTENT_TYPE_LATEST  # of GET /metrics


class BodyLimit:
    """413 for a body over the limit: by its Content-Length, or while it streams in."""

    def __init__(self, app, *, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.max_bytes} bytes", code="body_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            error = self._too_large()
            return await JSONResponse(error.body(), error.status)(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)


class CountRequests:
    """Counts answered requests by endpoint and status for /metrics: `endpoints` are the labels,
    any other path is "other" (OpenAI's routes without /v1 count as theirs with it)."""

    def __init__(self, app, *, metrics: Metrics, endpoints: tuple[str, ...]):
        self.app, self.metrics, self.endpoints = app, metrics, endpoints

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            path = scope["path"]
            path = "/v1" + path if "/v1" + path in self.endpoints else path  # OpenAI's routes without /v1
            endpoint = (
                path if path in self.endpoints else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
            )
            self.metrics.requests.labels(endpoint, str(status)).inc()


class Server(uvicorn.Server):
    """uvicorn, but Ctrl-C / SIGTERM end the generations first and the process exits 0 afterwards
    (uvicorn itself re-raises the signal once it has shut down)."""

    def __init__(self, config: uvicorn.Config, *, on_exit):
        super().__init__(config)
        self._on_exit = on_exit

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(host: str, *, api_key: str | None, insecure: bool) -> None:
    if not is_loopback(host) and not api_key and not insecure:
        raise UsageError(
            f"refusing to serve on {host} (reachable from other machines) without an API key:"
            " give --api-key (or SPECGGUF_API_KEY), or --insecure to serve it open"
        )


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, its protocol said to be TCP: asyncio turns Nagle's algorithm off
    (TCP_NODELAY) only on connections whose socket says so, and `create_server`'s says 0. With Nagle on,
    a whole answer's body (written after its headers) waited for the client's delayed ACK: 40 ms on
    every response that is not streamed (an editor's completion)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        made = socket.create_server((host, port), family=family)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=made.detach())


class Metrics:
    """`GET /metrics`: Prometheus text exposition, through prometheus_client (its own registry per server)."""

    def __init__(self, queue_length: Callable[[], int]):
        disable_created_metrics()  # no `*_created` samples: they double the output and say little here
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "specgguf_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "specgguf_prompt_tokens", "Prompt tokens of finished generations", registry=registry
        )
        self.prompt_tokens_cached = Counter(
            "specgguf_prompt_tokens_cached", "Prompt tokens the verifier's KV cache already held", registry=registry
        )
        self.generated = Counter("specgguf_tokens_generated", "Tokens generated", registry=registry)
        self.drafted = Counter("specgguf_tokens_drafted", "Draft tokens proposed", registry=registry)
        self.accepted = Counter("specgguf_tokens_accepted", "Draft tokens the verifier accepted", registry=registry)
        self.drafted_at = Counter(
            "specgguf_drafts_by_position",
            "Draft tokens proposed at each position of a step (0 = first)",
            ["position"],
            registry=registry,
        )
        self.accepted_at = Counter(
            "specgguf_drafts_accepted_by_position",
            "Draft tokens accepted at each position; divide by specgguf_drafts_by_position for acceptance",
            ["position"],
            registry=registry,
        )
        queue_gauge = Gauge("specgguf_queue_length", "Requests waiting for the worker", registry=registry)
        queue_gauge.set_function(queue_length)
        self.first_token = Histogram(
            "specgguf_time_to_first_token_seconds",
            "From a request's arrival to its first generated token (queueing and prompt included)",
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tokens_per_second = Histogram(
            "specgguf_tokens_per_second",
            "Generation speed per request (prompt excluded)",
            registry=registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
        )

    def observe(self, finished) -> None:
        """One generation's totals (a `generator.Finished`); called from the worker thread."""
        stats = finished.stats
        self.prompt_tokens.inc(finished.n_prompt)
        self.prompt_tokens_cached.inc(finished.n_cached)
        self.generated.inc(stats.n_tokens)
        self.drafted.inc(stats.n_drafted)
        self.accepted.inc(stats.n_accepted)
        for position, (n_drafted, n_accepted) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
            self.drafted_at.labels(str(position)).inc(n_drafted)
            self.accepted_at.labels(str(position)).inc(n_accepted)
        if finished.first_token_seconds is not None:
            self.first_token.observe(finished.first_token_seconds)
        if stats.wall_seconds > 0 and stats.n_tokens:
            self.tokens_per_second.observe(stats.tokens_per_second)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
