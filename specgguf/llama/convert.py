"""Re-quantizing a GGUF with llama.cpp's own quantizer (a draft may be changed freely; a verifier
only into a copy the user asked for, such as the F16 benchmark variant).

`requantize_draft` makes a row of llama/variants.py's `REQUANTIZATIONS` (the drafts specgguf can
make for this machine), its types named as llama.cpp names them. Which one a machine gets is
measured, not chosen by name (drafts/made.py).
"""

from __future__ import annotations

import ctypes
import os
import secrets
from pathlib import Path

import llama_cpp

from ..errors import ModelLoadError
from .runtime import ends_at_ctrl_c, reason
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
    through a partial file of its own renamed at the end: never a half-written model under the final
    name, and two processes making it at once both succeed. Ctrl-C ends the process at once (exit 130,
    one line, the partial removed): llama.cpp's quantizer cannot be asked to stop."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    if token_embedding is not None:
        params.token_embedding_type = token_embedding
    params.allow_requantize = True
    params.nthread = n_threads or (os.cpu_count() or 1)
    destination.parent.mkdir(parents=True, exist_ok=True)
    # A partial of its own: two processes making the same variant at once each rename a whole file.
    # Named before it exists and the Ctrl-C handler set first, so no interrupt finds it unnamed.
    partial = destination.with_name(f"{destination.name}.{secrets.token_hex(4)}.incomplete")
    try:
        with ends_at_ctrl_c(partial):
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
        if status != 0:
            raise ModelLoadError(
                f"could not re-quantize {source.name} into {destination.parent}: {reason(str(status))}"
            )
        os.replace(partial, destination)
    except BaseException:  # no partial file stays behind
        partial.unlink(missing_ok=True)
        raise
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
