"""Re-quantizing a GGUF with llama.cpp's own quantizer (a draft may be changed freely; a verifier
only into a copy the user asked for, such as the F16 benchmark variant)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from ..errors import ModelLoadError
from .runtime import reason


def convert_to_f16(source: Path, destination: Path, *, n_threads: int | None = None) -> Path:
    """Re-quantize a GGUF to F16 (e.g. to get a memory-bound verifier for benchmarks)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = n_threads or (os.cpu_count() or 1)
    partial = destination.with_name(destination.name + ".incomplete")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if status != 0:
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"could not convert {source} to F16: {reason(str(status))}")
    os.replace(partial, destination)
    return destination
