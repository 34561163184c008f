"""Re-quantizing a GGUF with llama.cpp's own quantizer (a draft may be changed freely; a verifier
only into a copy the user asked for, such as the F16 benchmark variant).

`requantize_draft` makes a row of llama/variants.py's `REQUANTIZATIONS` (the drafts specgguf can
make for this machine), its types named as llama.cpp names them. Which one a machine gets is
measured, not chosen by name (draft_variant.py).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from ..errors import ModelLoadError
from .runtime import reason
from .variants import Requantization


def requantize(
    source: Path,
    destination: Path,
    *,
    ftype: int,
    token_embedding: int | None = None,
    n_threads: int | None = None,
) -> Path:
    """Write `source` re-quantized to `ftype` (and token_embd to `token_embedding`) as `destination`,
    through a partial file renamed at the end: never a half-written model under the final name."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    if token_embedding is not None:
        params.token_embedding_type = token_embedding
    params.allow_requantize = True
    params.nthread = n_threads or (os.cpu_count() or 1)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".incomplete")
    try:
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    except BaseException:  # Ctrl-C is raised once llama.cpp returns: no partial file stays behind
        partial.unlink(missing_ok=True)
        raise
    if status != 0:
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"could not re-quantize {source.name}: {reason(str(status))}")
    os.replace(partial, destination)
    return destination


def requantize_draft(source: Path, destination: Path, row: Requantization) -> Path:
    """`source` re-quantized as the table's `row` says, written as `destination`."""
    return requantize(
        source,
        destination,
        ftype=getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{row.body}"),
        token_embedding=getattr(llama_cpp, f"GGML_TYPE_{row.token_embedding}"),
    )


def convert_to_f16(source: Path, destination: Path, *, n_threads: int | None = None) -> Path:
    """Re-quantize a GGUF to F16 (e.g. to get a memory-bound verifier for benchmarks)."""
    return requantize(source, destination, ftype=llama_cpp.LLAMA_FTYPE_MOSTLY_F16, n_threads=n_threads)
