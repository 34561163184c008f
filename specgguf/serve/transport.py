"""The server's transport pieces around the FastAPI app: body-size limit, request counting,
a uvicorn server that stops cleanly on signals, and the address checks."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading

import uvicorn
from fastapi.responses import JSONResponse

from ..errors import UsageError
from .common import ApiError
from .metrics import Metrics


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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
