"""ggml's backend registry through ctypes: RPC devices, local devices, the RPC server.

Imported only by rpc_devices.py, which hands in the directory of the libggml that
llama-cpp-python loaded (dlopen gives back that same, already loaded library).
The calls are the ones llama.cpp's own tools make: `common/arg.cpp` (--rpc) looks
up the "RPC" registry and its `ggml_backend_rpc_add_server`; `tools/rpc/rpc-server.cpp`
calls `ggml_backend_rpc_start_server` with the local devices.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

# enum ggml_backend_dev_type (ggml-backend.h)
_DEVICE_CPU, _DEVICE_GPU, _DEVICE_IGPU, _DEVICE_ACCEL = 0, 1, 2, 3

_AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_StartServer = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
)
AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


class Ggml:
    def __init__(self, lib_dir: Path):
        self._lib = lib = ctypes.CDLL(str(lib_dir / "libggml.so"))  # with libggml-base.so, its dependency
        pointer, size, text = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        for name, argtypes, restype in (
            ("ggml_backend_reg_by_name", [text], pointer),
            ("ggml_backend_reg_get_proc_address", [pointer, text], pointer),
            ("ggml_backend_reg_dev_count", [pointer], size),
            ("ggml_backend_reg_dev_get", [pointer, size], pointer),
            ("ggml_backend_reg_name", [pointer], text),
            ("ggml_backend_dev_count", [], size),
            ("ggml_backend_dev_get", [size], pointer),
            ("ggml_backend_dev_type", [pointer], ctypes.c_int),
            ("ggml_backend_dev_name", [pointer], text),
            ("ggml_backend_dev_backend_reg", [pointer], pointer),
            ("ggml_set_abort_callback", [AbortCallback], pointer),
            ("ggml_blck_size", [ctypes.c_int], ctypes.c_int64),
            ("ggml_type_size", [ctypes.c_int], size),
        ):
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype
        self._abort_callback: object = None  # kept alive while ggml holds it

    def _rpc_function(self, name: str, prototype):
        registry = self._lib.ggml_backend_reg_by_name(b"RPC")
        address = registry and self._lib.ggml_backend_reg_get_proc_address(registry, name.encode())
        return prototype(address) if address else None

    def has_rpc(self) -> bool:
        return self._rpc_function("ggml_backend_rpc_add_server", _AddServer) is not None

    def add_rpc_server(self, endpoint: str) -> list[int]:
        """A worker's devices, from the registry `ggml_backend_rpc_add_server` makes for it.

        Unlike llama.cpp's --rpc, the registry is not added to ggml's global device
        list: models get these devices only through llama_model_params.devices. A model
        loaded with llama.cpp's default device list (which puts RPC devices first) can
        then never reach for a worker, which aborts the process once the worker is gone.
        ggml-rpc connects here and aborts the process if it cannot: probe first.
        """
        add_server = self._rpc_function("ggml_backend_rpc_add_server", _AddServer)
        registry = add_server(endpoint.encode())
        if not registry:
            return []
        return [
            self._lib.ggml_backend_reg_dev_get(registry, i)
            for i in range(self._lib.ggml_backend_reg_dev_count(registry))
        ]

    def local_offload_devices(self) -> list[int]:
        """This machine's GPUs (none on a CPU build): llama.cpp's default list without RPC devices.
        The CPU is not in such a list: llama.cpp keeps whatever is not offloaded there."""
        gpus, igpus = [], []
        for i in range(self._lib.ggml_backend_dev_count()):
            device = self._lib.ggml_backend_dev_get(i)
            kind = self._lib.ggml_backend_dev_type(device)
            registry_name = self._lib.ggml_backend_reg_name(self._lib.ggml_backend_dev_backend_reg(device))
            if kind == _DEVICE_GPU and registry_name != b"RPC":
                gpus.append(device)
            elif kind == _DEVICE_IGPU:
                igpus.append(device)
        return gpus or igpus[:1]

    def server_devices(self) -> list[tuple[int, str]]:
        """What rpc-server serves by default: the accelerators, else the CPU."""
        devices = []
        for i in range(self._lib.ggml_backend_dev_count()):
            device = self._lib.ggml_backend_dev_get(i)
            registry_name = self._lib.ggml_backend_reg_name(self._lib.ggml_backend_dev_backend_reg(device))
            if self._lib.ggml_backend_dev_type(device) in (_DEVICE_GPU, _DEVICE_IGPU) and registry_name != b"RPC":
                devices.append(device)
        if not devices:
            devices = [
                self._lib.ggml_backend_dev_get(i)
                for i in range(self._lib.ggml_backend_dev_count())
                if self._lib.ggml_backend_dev_type(self._lib.ggml_backend_dev_get(i)) == _DEVICE_CPU
            ][:1]
        return [(device, self._lib.ggml_backend_dev_name(device).decode("utf-8", "replace")) for device in devices]

    def start_rpc_server(self, endpoint: str, *, cache_dir: str | None, n_threads: int, devices: list[int]) -> None:
        """Serve until the process ends (returns only if the server could not start)."""
        start_server = self._rpc_function("ggml_backend_rpc_start_server", _StartServer)
        array = (ctypes.c_void_p * len(devices))(*devices)
        start_server(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), array)

    def type_traits(self, n_types: int) -> tuple[list[int], list[int]]:
        """Each ggml type's block size (elements; 0 for a removed type) and size (bytes of a block)."""
        types = range(n_types)
        return [self._lib.ggml_blck_size(t) for t in types], [self._lib.ggml_type_size(t) for t in types]

    def on_abort(self, callback) -> None:
        """Call `callback(message)` when ggml is about to abort() the process (it cannot be stopped)."""

        def hook(message: bytes) -> None:
            callback(message.decode("utf-8", "replace"))

        self._abort_callback = AbortCallback(hook)
        self._lib.ggml_set_abort_callback(self._abort_callback)
