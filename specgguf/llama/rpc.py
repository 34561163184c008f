"""llama.cpp RPC workers as seen from here: addresses, a handshake probe, a watchdog.

llama.cpp's RPC client (ggml-rpc, protocol v7 in the vendored version) has no
time-outs and calls abort() when a worker is unreachable, answers nonsense or
goes away. So, before llama.cpp touches a worker, `probe` does the client's
handshake itself over a socket with a time-out: connect, `HELLO`, check the
version. After that, failures inside llama.cpp cannot be recovered from (the
process is going to abort): `Watchdog` bounds how long a llama.cpp call may
wait on the workers, and `fatal_rpc_failure` (also called from ggml's abort
hook) names the worker that went away in one line, then exits with status 1.
No llama_cpp import here: plain sockets and threads.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import SpecggufError, UsageError
from .rpc_frames import TOKEN_ACCEPTED, TOKEN_NOT_NEEDED, TOKEN_REFUSED, present_token

# ggml-rpc.cpp / ggml-rpc.h of the vendored llama.cpp (llama-cpp-python 0.3.36).
PROTOCOL_MAJOR = 7
PROTOCOL_MINOR = 0
MAX_WORKERS = 16  # GGML_RPC_MAX_SERVERS
_CMD_HELLO = 14
_CONN_CAPS_SIZE = 24  # rpc_msg_hello_req: conn_caps[24]; the answer: major, minor, patch, pad, conn_caps[24]
_HELLO_ANSWER_SIZE = 4 + _CONN_CAPS_SIZE
DEFAULT_PORT = 50052
DEFAULT_TIMEOUT = 60.0
TOKEN_ENV = "SPECGGUF_WORKER_TOKEN"  # the shared secret, on both sides


class RpcWorkerError(SpecggufError):
    """An RPC worker cannot be used: unreachable, another protocol, gone, or silent too long."""


@dataclass(frozen=True)
class RpcWorker:
    host: str
    port: int
    token: str | None = field(default=None, repr=False, compare=False)  # the worker's --token, if it has one

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_workers(text: str) -> tuple[RpcWorker, ...]:
    """'HOST:PORT[,HOST:PORT...]' -> workers; a bad entry is a UsageError naming it."""
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise UsageError("--rpc needs HOST:PORT[,HOST:PORT...]")
    workers: list[RpcWorker] = []
    for entry in entries:
        host, colon, port_text = entry.rpartition(":")
        if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UsageError(f"--rpc: {entry!r} is not HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT})")
        if ":" in host or any(c.isspace() for c in host):
            raise UsageError(f"--rpc: {entry!r}: llama.cpp's RPC client takes an IPv4 address or a host name")
        try:
            host.encode("idna")  # what the resolver will do with it: an empty or 64+ character label fails
        except UnicodeError:
            raise UsageError(
                f"--rpc: {entry!r}: not a valid host name (each dot-separated part 1 to 63 characters)"
            ) from None
        worker = RpcWorker(host, int(port_text))
        if worker in workers:
            raise UsageError(f"--rpc: {worker} is given twice")
        workers.append(worker)
    if len(workers) > MAX_WORKERS:
        raise UsageError(f"--rpc: at most {MAX_WORKERS} workers, got {len(workers)}")
    return tuple(workers)


def check_listen_address(host: str, port: int) -> None:
    """What `ggml_backend_rpc_start_server` would fail on, as a one-line error (it only prints)."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(f"--host must be an IPv4 address such as 127.0.0.1 or 0.0.0.0, not {host!r}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml does
        try:
            listener.bind((host, port))
        except OSError as error:
            raise RpcWorkerError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def is_loopback(host: str) -> bool:
    return ipaddress.IPv4Address(host).is_loopback


# --- the client's handshake, done here first -------------------------------------------
def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def probe(worker: RpcWorker, *, timeout: float) -> tuple[int, int, int]:
    """Connect and say HELLO as llama.cpp's client would; the worker's protocol version.

    Raises RpcWorkerError naming the worker when it is unreachable, silent for
    `timeout` seconds, not a llama.cpp RPC server, or of another protocol version.
    """
    try:
        connection = socket.create_connection((worker.host, worker.port), timeout=timeout)
    except socket.gaierror as error:
        raise RpcWorkerError(f"RPC worker {worker}: cannot resolve {worker.host!r} ({error.strerror})") from None
    except ConnectionRefusedError:
        raise RpcWorkerError(
            f"RPC worker {worker}: connection refused (is `specgguf worker` running there, on that port?)"
        ) from None
    except TimeoutError:
        raise RpcWorkerError(
            f"RPC worker {worker}: no connection within {timeout:g} s (host down or firewalled?)"
        ) from None
    except OSError as error:
        raise RpcWorkerError(f"RPC worker {worker}: cannot connect ({error.strerror or error})") from None
    with connection:
        if worker.token is not None:
            _present_token(connection, worker, timeout)
        try:
            connection.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE))
            header = _receive(connection, 8)
            size = struct.unpack("<Q", header)[0] if len(header) == 8 else None
            answer = _receive(connection, _HELLO_ANSWER_SIZE) if size == _HELLO_ANSWER_SIZE else b""
        except TimeoutError:
            raise RpcWorkerError(
                f"RPC worker {worker}: no answer to the handshake within {timeout:g} s (a"
                " worker serves one client at a time: is another one using it?)"
            ) from None
        except OSError as error:
            raise RpcWorkerError(f"RPC worker {worker}: the handshake failed ({error.strerror or error})") from None
    if len(answer) != _HELLO_ANSWER_SIZE:
        heard = "closed the connection" if not header else f"answered {header[:8]!r}"
        hint = "" if header or worker.token else f"a worker started with --token needs {TOKEN_ENV} here; "
        raise RpcWorkerError(
            f"RPC worker {worker}: {heard} instead of a llama.cpp RPC v{PROTOCOL_MAJOR}"
            f" handshake ({hint}another program, or another llama.cpp version, on that port?)"
        )
    major, minor, patch = answer[0], answer[1], answer[2]
    if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
        raise RpcWorkerError(
            f"RPC worker {worker}: speaks RPC protocol {major}.{minor}.{patch}, this build"
            f" needs {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}.x: run the same llama.cpp version"
            " (the same specgguf install) on both machines"
        )
    return major, minor, patch


def _present_token(connection: socket.socket, worker: RpcWorker, timeout: float) -> None:
    """The shared secret before ggml's HELLO, as `specgguf worker --token` expects it."""
    assert worker.token is not None
    try:
        status = present_token(connection, worker.token)
    except TimeoutError:
        raise RpcWorkerError(f"RPC worker {worker}: no answer to the token within {timeout:g} s") from None
    except OSError:
        status = None
    if status == TOKEN_REFUSED:
        raise RpcWorkerError(f"RPC worker {worker} refused the token: {TOKEN_ENV} is not its --token")
    if status == TOKEN_NOT_NEEDED:
        raise RpcWorkerError(f"RPC worker {worker} takes no token (started without --token): unset {TOKEN_ENV}")
    if status != TOKEN_ACCEPTED:
        raise RpcWorkerError(
            f"RPC worker {worker} does not answer a token ({TOKEN_ENV} is set):"
            " is it a `specgguf worker` of this version?"
        )


# --- after llama.cpp took over: bounded waits, one line when a worker fails ----------------
def _still_there(worker: RpcWorker) -> str | None:
    """None if the worker still accepts connections, else why not (a connect only, no handshake)."""
    try:
        with socket.create_connection((worker.host, worker.port), timeout=2.0):
            return None
    except ConnectionRefusedError:
        return "connection refused now"
    except OSError as error:
        return f"unreachable now: {error.strerror or error}"


def fatal_rpc_failure(workers: Sequence[RpcWorker], *, during: str, detail: str) -> None:
    """Name the worker(s) that went away in one line on stderr and exit 1, now.

    Called when llama.cpp is about to abort, or is stuck in a call that cannot be
    interrupted: nothing can be unwound, so this writes one line and leaves with os._exit.
    """
    gone = [(worker, reason) for worker in workers if (reason := _still_there(worker))]
    if gone:
        message = "; ".join(f"RPC worker {worker} went away {during} ({reason})" for worker, reason in gone)
    else:
        names = ", ".join(map(str, workers))
        message = f"RPC worker{'s' if len(workers) > 1 else ''} {names}: {detail} {during}"
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"\nspecgguf: error: {message}\n".encode("utf-8", "replace"))
    os._exit(1)


class Watchdog:
    """Bounds how long a llama.cpp call may wait on the workers, and says what was running.

    llama.cpp's RPC sockets have no time-out: a worker that stops answering (stopped,
    overloaded, cut off) would block `llama_decode` forever. A guarded call that runs
    past `timeout` ends the process with a one-line error.
    """

    def __init__(self, workers: Sequence[RpcWorker], *, timeout: float):
        self.workers, self.timeout = tuple(workers), timeout
        self._deadline: float | None = None
        self.during = "while connecting"
        self._changed = threading.Condition()
        threading.Thread(target=self._watch, name="specgguf-rpc-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, during: str) -> Iterator[None]:
        self.feed(during)
        try:
            yield
        finally:
            with self._changed:
                self._deadline = None

    def feed(self, during: str) -> None:
        """(Re)start the clock: the workers have `timeout` seconds from now."""
        with self._changed:
            self._deadline, self.during = time.monotonic() + self.timeout, during
            self._changed.notify()

    def fail(self, detail: str) -> None:
        fatal_rpc_failure(self.workers, during=self.during, detail=detail)

    def _watch(self) -> None:
        with self._changed:
            while True:
                if self._deadline is None:
                    self._changed.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._changed.wait(remaining)
                    continue
                self.fail(f"no answer within {self.timeout:g} s (--rpc-timeout)")


@dataclass(frozen=True)
class Placement:
    """Where a model's layers are: on RPC workers (some or all of them) or here."""

    workers: tuple[str, ...] = ()
    n_layers: int = 0
    n_layers_remote: int = 0

    def describe(self, role: str) -> str:
        if not self.workers:
            return f"{role} local"
        count = len(self.workers)
        text = f"{role} on {count} RPC worker{'s' if count > 1 else ''}"
        n_local = self.n_layers - self.n_layers_remote
        return text + (f" + local ({n_local} of {self.n_layers} layers)" if n_local > 0 else "")
