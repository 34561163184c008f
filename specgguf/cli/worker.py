"""`specgguf worker`: this machine's devices for another machine's verifier, over llama.cpp RPC.

The server is ggml's own (`ggml_backend_rpc_start_server`, as llama.cpp's `rpc-server`
runs it), so either kind of worker serves either kind of client of the same llama.cpp
version. ggml's server trusts its peer, so it is not what listens: it runs in a child
process on a private loopback port (`InnerServer`, restarted when it dies), and the
public address is our relay's (llama/rpc_relay.py), which checks the token (`--token`)
and passes on only well-formed requests. The main thread waits for Ctrl-C or SIGTERM,
with those signals blocked in the relay's threads, and watches the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from ..errors import UsageError
from ..llama.rpc import (
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    TOKEN_ENV,
    RpcWorkerError,
    check_listen_address,
    is_loopback,
)
from ..llama.rpc_relay import WorkerRelay

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_START_TRIES = 3
_START_WAIT = 60.0  # seconds for the child to load llama.cpp and listen
_CONNECT_WAIT = 10.0  # seconds to connect to it (not to wait for its answers: a graph takes what it takes)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class InnerServer:
    """ggml's RPC server in a child process on 127.0.0.1:`port`, started again when it dies."""

    def __init__(self, *, n_threads: int, cache_dir: Path | None):
        self._command = [sys.executable, "-m", "specgguf.llama.rpc_child", "PORT", str(n_threads)]
        self._command += [str(cache_dir)] if cache_dir is not None else []
        self.process: subprocess.Popen | None = None
        self.port = 0
        self._ready = threading.Event()

    def start(self) -> None:
        """Start it, and wait until it listens; RpcWorkerError when it cannot be started."""
        self._ready.clear()
        for _ in range(_START_TRIES):
            self.port = _free_port()
            self._command[3] = str(self.port)
            self.process = subprocess.Popen(self._command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + _START_WAIT
            while self.process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    self._ready.set()
                    return
                time.sleep(0.05)
            self.stop()
        raise RpcWorkerError(f"ggml's RPC server could not be started ({_START_TRIES} tries): the worker stops")

    def died(self) -> str | None:
        """Why the child ended (a signal's name or an exit status), or None while it runs."""
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return None
        self._ready.clear()
        if code >= 0:
            return f"exit status {code}"
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"

    def connect(self) -> socket.socket:
        """A connection to it, for one client (waiting while it restarts)."""
        if not self._ready.wait(_START_WAIT):
            raise OSError("ggml's RPC server is not running")
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=_CONNECT_WAIT)
        # Blocking from here on: an answer comes when ggml has computed it (a long prompt on a slow
        # worker takes more than any fixed time), and the client's --rpc-timeout is the bound that counts.
        connection.settimeout(None)
        return connection

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _listen(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server((host, port), backlog=16)
    except OSError as error:
        raise RpcWorkerError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def _memory_limit() -> int:
    """The largest request data the relay passes on: this machine's memory (ggml holds it all at once)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def serve(
    *,
    host: str,
    port: int,
    n_threads: int | None,
    cache_dir: Path | None,
    err_console: Console,
    token: str | None = None,
) -> int:
    """Serve until Ctrl-C (exit status 130) or SIGTERM (0); the exit status."""
    from ..llama.rpc_devices import rpc_server_devices, type_traits  # llama.cpp loads only when needed

    if not 0 < port < 65536:
        raise UsageError(f"--port must be 1-65535, not {port}")
    if token is None and TOKEN_ENV in os.environ:  # click reads an empty variable as no value at all
        raise UsageError(f"{TOKEN_ENV} is set but empty: give the shared secret there, or unset it to serve without")
    if token is not None and not 0 < len(token.encode()) <= 1024:
        raise UsageError("--token must be 1 to 1024 bytes")
    if token is not None and not token.strip():
        raise UsageError(f"--token ({TOKEN_ENV}) is only spaces: give a shared secret")
    check_listen_address(host, port)
    if cache_dir is not None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--cache {cache_dir}: {error.strerror or error}") from None
    devices = rpc_server_devices()
    threads = n_threads or max(1, (os.cpu_count() or 2) // 2)  # rpc-server's default
    if not is_loopback(host):
        _warn_exposed(host, port, token is not None, err_console)
    inner = InnerServer(n_threads=threads, cache_dir=cache_dir)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # threads and the child inherit the mask
    try:
        inner.start()
        listener = _listen(host, port)

        def log(line: str) -> None:
            err_console.print(f"specgguf worker: {line}", markup=False, highlight=False)

        relay = WorkerRelay(
            listener,
            connect_inner=inner.connect,
            token=token,
            limit=_memory_limit(),
            log=log,
            type_traits=type_traits(),
        )
        names = ", ".join(name for _, name in devices)
        err_console.print(
            f"specgguf worker: {names} ({threads} threads) on {host}:{port}, llama.cpp RPC protocol"
            f" v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}{', token required' if token else ''}; clients: --rpc"
            f" {host}:{port} · Ctrl-C stops",
            style="dim",
        )
        threading.Thread(target=relay.serve_forever, name="rpc-relay", daemon=True).start()
        return _supervise(inner, log)
    finally:
        inner.stop()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _warn_exposed(host: str, port: int, with_token: bool, err_console: Console) -> None:
    what = (
        "clients must present the --token, but nothing is encrypted: anyone on the path can read what it computes"
        if with_token
        else "llama.cpp's RPC protocol has no authentication and no encryption: anyone who reaches"
        " this port can use this machine's devices and read what it computes (--token requires a shared secret)"
    )
    err_console.print(
        f"warning: serving on {host}:{port}. {what}. Expose it only on a trusted network.", style="bold yellow"
    )


def _supervise(inner: InnerServer, log) -> int:
    while True:
        received = signal.sigtimedwait(_STOP_SIGNALS, 0.25)
        if received is not None:
            return 130 if received.si_signo == signal.SIGINT else 0
        if (reason := inner.died()) is not None:
            log(f"ggml's RPC server ended ({reason}); starting it again")
            inner.start()


def exit_now(code: int) -> None:
    """Leave without waiting for the relay's threads (blocked in accept and recv)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
