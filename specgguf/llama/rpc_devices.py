"""RPC devices in this process: workers' devices registered with ggml (the client side), and ggml's
RPC server on this machine's devices (`specgguf worker`)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from ..errors import ModelLoadError
from .ggml_devices import Ggml
from .rpc import RpcWorker, Watchdog, probe
from .rpc_relay import TokenTunnel

# --- RPC: layers on other machines' `specgguf worker` (or llama.cpp rpc-server) ---
RPC_INSTALL = (
    "this llama-cpp-python was built without llama.cpp's RPC backend; reinstall it with RPC:"
    " CMAKE_ARGS='-DGGML_RPC=ON' pip install --no-cache-dir --force-reinstall"
    " llama-cpp-python==0.3.36 (what `make install` does)"
)
_ggml: Ggml | None = None
_watchdog: Watchdog | None = None  # set once RPC devices are registered in this process
_tunnels: dict[RpcWorker, TokenTunnel] = {}  # the loopback ports through which ggml reaches workers with a token


def _ggml_library() -> Ggml:
    global _ggml
    if _ggml is None:
        _ggml = Ggml(Path(llama_cpp.__file__).parent / "lib")
    return _ggml


def _require_rpc() -> Ggml:
    ggml = _ggml_library()
    if not llama_cpp.llama_supports_rpc() or not ggml.has_rpc():
        raise ModelLoadError(RPC_INSTALL)
    return ggml


def register_workers(workers: Sequence[RpcWorker], timeout: float) -> ctypes.Array:
    """Check each worker's handshake ourselves (ggml-rpc would abort), then register its devices:
    a NULL-terminated device list, for llama_model_params.devices."""
    global _watchdog
    ggml = _require_rpc()
    for worker in workers:
        # Not once this process holds a connection to it: a worker serves one client at a time.
        if _watchdog is None or worker not in _watchdog.workers:
            probe(worker, timeout=min(timeout, 10.0))
    if _watchdog is None:
        _watchdog = watchdog = Watchdog(workers, timeout=timeout)
        # From here on a failing worker makes ggml abort(): say which one, in one line.
        ggml.on_abort(
            lambda message: watchdog.fail(f"llama.cpp's RPC client failed ({message.rsplit(': ', 1)[-1].strip()})")
        )
    else:
        _watchdog.workers = tuple(dict.fromkeys(_watchdog.workers + tuple(workers)))
    devices = []
    for worker in workers:
        endpoint = str(worker)
        if worker.token is not None:  # ggml's client knows no token: it connects through a tunnel that does
            if worker not in _tunnels:
                _tunnels[worker] = TokenTunnel(worker.host, worker.port, worker.token, timeout=min(timeout, 10.0))
            endpoint = _tunnels[worker].endpoint
        with _watchdog.guard(f"while connecting to {worker}"):
            found = ggml.add_rpc_server(endpoint)
        if not found:
            raise ModelLoadError(f"RPC worker {worker} offers no device")
        devices.extend(found)
    return _device_list(devices)


def _device_list(devices: list[int]) -> ctypes.Array:
    """A NULL-terminated ggml_backend_dev_t array, for llama_model_params.devices."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def rpc_server_devices() -> list[tuple[int, str]]:
    return _require_rpc().server_devices()


def type_traits() -> tuple[np.ndarray, np.ndarray]:
    """ggml's block size and block bytes of each of its types: how the worker's relay counts a tensor's bytes."""
    block_sizes, type_sizes = _require_rpc().type_traits(llama_cpp.GGML_TYPE_COUNT)
    return np.array(block_sizes, np.uint64), np.array(type_sizes, np.uint64)


def start_rpc_server(endpoint: str, *, cache_dir: str | None, n_threads: int, devices: list[int]) -> None:
    """ggml's RPC server on this machine's devices: blocks (in C) for as long as it serves."""
    _require_rpc().start_rpc_server(endpoint, cache_dir=cache_dir, n_threads=n_threads, devices=devices)


def watchdog() -> Watchdog | None:
    """The watchdog over this process's RPC workers, once any were registered."""
    return _watchdog


def local_devices() -> ctypes.Array:
    """This machine's own offload devices, for a model that must not land on a worker."""
    return _device_list(_ggml_library().local_offload_devices())
