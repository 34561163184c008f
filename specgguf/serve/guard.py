"""What a web page must not do to the local server, and a log that stays one line per error.

`Guard` is ASGI middleware in front of the routes: a `Host` that does not name this server is refused
(DNS rebinding: a page whose name resolves to 127.0.0.1 would otherwise read the answers), a request
from a browser page of another origin is refused unless `--cors-origin` names it (allowed ones get
CORS headers, preflight included), and a POST body must be `application/json` (a page may send a
"simple" `text/plain` POST to any address without asking first) — except JSON sent as form data to
Ollama's routes by a program (`curl -d`, as Ollama's own examples send it, and Ollama reads any body
as JSON): a browser page's POST always carries an `Origin`, so a page must still send JSON, and
that asks first. A client that hangs up mid-body ends its request quietly. `OneLineLog` turns the
server's error log into one rate-limited line each.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from ..errors import UsageError
from .common import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ANY_ADDRESS = ("0.0.0.0", "::", "")
log = logging.getLogger("uvicorn.error")


def _split_host(value: str) -> tuple[str, str | None]:
    """'name:port' -> ('name', 'port'); '[::1]:80' -> ('[::1]', '80'); no port -> (value, None)."""
    host, colon, port = value.rpartition(":")
    if not colon or host.count(":") and not host.endswith("]") or value.endswith("]"):
        return value, None
    return host, port


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPolicy:
    """The Host values and browser origins this server answers."""

    bound_host: str
    port: int
    allowed_hosts: tuple[str, ...] = ()  # names (any port of ours) or name:port; '*' turns the check off
    cors_origins: tuple[str, ...] = ()  # 'http://site:port' exactly, or '*'

    def _names(self) -> set[str]:
        bound = f"[{self.bound_host}]" if ":" in self.bound_host else self.bound_host
        return {name.lower() for name in (bound, *LOOPBACK_NAMES, *self.allowed_hosts)}

    def host_allowed(self, value: str | None) -> bool:
        if value is None or "*" in self.allowed_hosts:
            return True  # no Host at all is no browser (every browser sends one)
        return self._names_this_server(value)

    def _names_this_server(self, value: str) -> bool:
        value = value.strip().lower()
        if value in {entry.lower() for entry in self.allowed_hosts if ":" in entry.strip("[]")}:
            return True  # an entry that names its port
        host, port = _split_host(value)
        if port is None and self.port != 80 or port is not None and port != str(self.port):
            return False
        if self.bound_host in ANY_ADDRESS and _is_ip_literal(host):
            return True  # bound everywhere: any address of this machine (rebinding needs a name)
        return host in self._names()

    def origin_allowed(self, origin: str) -> bool:
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        scheme, _, rest = origin.partition("://")
        return scheme == "http" and "/" not in rest and self._names_this_server(rest)  # same origin


def parse_origins(values: list[str] | None) -> tuple[str, ...]:
    """--cors-origin values (repeated, or comma-separated as in OLLAMA_ORIGINS), checked."""
    origins = tuple(part.strip().rstrip("/") for value in values or () for part in value.split(",") if part.strip())
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or scheme not in ("http", "https") or not rest or "/" in rest):
            raise UsageError(f"--cors-origin {origin!r}: give an origin as scheme://host[:port], or '*'")
    return origins


def parse_hosts(values: list[str] | None) -> tuple[str, ...]:
    hosts = tuple(part.strip() for value in values or () for part in value.split(",") if part.strip())
    for host in hosts:
        if any(c.isspace() or c in "/@" for c in host):
            raise UsageError(f"--allowed-hosts {host!r}: give a host name, name:port, or '*'")
    return hosts


def check_api_key(api_key: str | None) -> str | None:
    """The key as a client can send it: without the spaces around it (a header's value has none: a key
    pasted with a trailing space or new line could never match), refused if only spaces (it would
    ask for a key no client can send) or not printable ASCII. None or "": no key."""
    if not api_key:
        return None
    key = api_key.strip()
    if not key:
        raise UsageError("--api-key is only spaces: give a key, or none to serve without one")
    if not (key.isascii() and key.isprintable()):
        raise UsageError("--api-key must be printable ASCII: an HTTP header cannot carry other characters")
    return key


def _refuse(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(ApiError(status, message, code=code).body(), status)


def _media(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _json_allowed(path: str, headers: dict[str, str]) -> bool:
    """Whether a POST's body may be read as JSON: it says it is, or (Ollama's routes, a program) it
    is `curl -d`'s form data."""
    media = _media(headers.get("content-type", ""))
    curl = path.startswith("/api/") and "origin" not in headers and media == "application/x-www-form-urlencoded"
    return media == "application/json" or curl


class Guard:
    """Host, Origin and content-type checks before any route; CORS headers for allowed origins."""

    def __init__(self, app, *, policy: HostPolicy):
        self.app, self.policy = app, policy
        self.cors = CORSMiddleware(
            app,
            allow_origins=["*"],  # only origins that passed origin_allowed get this far
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            max_age=600,
        )

    def _check(self, scope) -> JSONResponse | None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        if not self.policy.host_allowed(headers.get("host")):
            return _refuse(
                403,
                f"this server does not answer for Host {headers['host'][:100]!r} (see serve --allowed-hosts)",
                "host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin):
            return _refuse(
                403, f"requests from origin {origin[:100]!r} are not allowed (see serve --cors-origin)", "cors_denied"
            )
        if scope["method"] == "POST" and not _json_allowed(scope["path"], headers):
            return _refuse(415, "the request body must be JSON (Content-Type: application/json)", "unsupported_media")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self._check(scope)
        if refused is not None:
            return await refused(scope, receive, send)
        try:
            await self.cors(scope, receive, send)
        except ClientDisconnect:
            log.info("a client hung up before sending its whole request")


class OneLineLog(logging.Filter):
    """Each error one line (its exception's name and message, no traceback), at most one per `interval`
    seconds; the next line that passes says how many were left out."""

    def __init__(self, interval: float = 1.0):
        super().__init__()
        self.interval, self._last, self._suppressed = interval, -float("inf"), 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage().splitlines()[0] if record.getMessage() else ""
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            message = f"{message}: {type(error).__name__}: {error}"
        record.msg, record.args, record.exc_info, record.exc_text = message[:300], None, None, None
        if record.levelno < logging.WARNING:
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._suppressed += 1
            return False
        if self._suppressed:
            record.msg = f"{record.getMessage()} ({self._suppressed} more like it left out)"
            record.args = None
        self._last, self._suppressed = now, 0
        return True


def quiet_logs() -> None:
    """One line per error in uvicorn's and asyncio's logs (a connection flood must not write megabytes)."""
    one_line = OneLineLog()
    for name in ("uvicorn.error", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineLog) for f in logger.filters):
            logger.addFilter(one_line)
