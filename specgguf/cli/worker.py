"""`specgguf worker`: this machine's devices for another machine's verifier, over llama.cpp RPC.

The server is ggml's own (`ggml_backend_rpc_start_server`, as llama.cpp's `rpc-server`
runs it), so either kind of worker serves either kind of client of the same llama.cpp
version. It blocks in C, so it runs in a thread while the main thread waits for
Ctrl-C or SIGTERM, with those signals blocked in the server's thread.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from rich.console import Console

from ..errors import UsageError
from ..llama.rpc import PROTOCOL_MAJOR, PROTOCOL_MINOR, RpcWorkerError, check_listen_address, is_loopback

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def serve(*, host: str, port: int, n_threads: int | None, cache_dir: Path | None, err_console: Console) -> int:
    """Serve until Ctrl-C (exit status 130) or SIGTERM (0); the exit status."""
    from ..llama.rpc_devices import rpc_server_devices, start_rpc_server  # llama.cpp loads only when needed

    if not 0 < port < 65536:
        raise UsageError(f"--port must be 1-65535, not {port}")
    check_listen_address(host, port)
    if cache_dir is not None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--cache {cache_dir}: {error.strerror or error}") from None
    devices = rpc_server_devices()
    threads = n_threads or max(1, (os.cpu_count() or 2) // 2)  # rpc-server's default
    if not is_loopback(host):
        err_console.print(
            f"warning: serving on {host}:{port}. llama.cpp's RPC protocol has no authentication"
            " and no encryption: anyone who reaches this port can run code on this machine's"
            " devices and read what it computes. Expose it only on a trusted network.",
            style="bold yellow",
        )
    names = ", ".join(name for _, name in devices)
    err_console.print(
        f"specgguf worker: {names} ({threads} threads) on {host}:{port}, llama.cpp RPC protocol"
        f" v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}; clients: --rpc {host}:{port} · Ctrl-C stops",
        style="dim",
    )
    failed = threading.Event()

    def run_server() -> None:
        start_rpc_server(
            f"{host}:{port}",
            cache_dir=str(cache_dir) if cache_dir else None,
            n_threads=threads,
            devices=[device for device, _ in devices],
        )
        failed.set()  # it only returns when it could not serve

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # the thread inherits the mask
    try:
        threading.Thread(target=run_server, name="rpc-server", daemon=True).start()
        while not failed.is_set():
            received = signal.sigtimedwait(_STOP_SIGNALS, 0.25)
            if received is not None:
                return 130 if received.si_signo == signal.SIGINT else 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    raise RpcWorkerError(f"ggml's RPC server stopped: it could not serve on {host}:{port}")


def exit_now(code: int) -> None:
    """Leave without waiting for the server thread, which never returns (it is blocked in accept)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
