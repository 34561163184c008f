"""Re-quantizing a GGUF with llama.cpp's own quantizer (a draft may be changed freely; a verifier
only into a copy the user asked for, such as the F16 benchmark variant).

`DRAFT_VARIANTS` is the table of drafts specgguf can make for this machine: each row a tensor
type for the body and one for the token embedding (which Qwen-style models also use as their
output head, the largest single tensor a small draft reads per token). Which one a machine
gets is measured, not chosen by name (draft_variant.py).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from ..errors import ModelLoadError
from .runtime import ends_at_ctrl_c, reason


@dataclass(frozen=True)
class DraftVariant:
    name: str
    ftype: int  # llama_ftype of the body
    token_embedding: int | None  # ggml_type of token_embd (and of a tied output head); None: the ftype's choice
    note: str


DRAFT_VARIANTS: dict[str, DraftVariant] = {
    variant.name: variant
    for variant in (
        DraftVariant(
            "q4_0",
            llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
            llama_cpp.GGML_TYPE_Q4_0,
            "Q4_0 everywhere: llama.cpp's repacked CPU kernels (AVX2, NEON) for the body, a 4-bit head",
        ),
        DraftVariant(
            "q4_0-q8head",
            llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
            llama_cpp.GGML_TYPE_Q8_0,
            "Q4_0 body, 8-bit token embedding and head (more of the draft's accuracy kept)",
        ),
        DraftVariant(
            "iq4_nl",
            llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
            llama_cpp.GGML_TYPE_IQ4_NL,
            "IQ4_NL everywhere: repacked kernels too, fewer bytes per weight, less accurate",
        ),
    )
}


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
    descriptor, name = tempfile.mkstemp(dir=destination.parent, prefix=f"{destination.name}.", suffix=".incomplete")
    os.close(descriptor)
    partial = Path(name)
    try:
        with ends_at_ctrl_c(partial):
            status = llama_cpp.llama_model_quantize(str(source).encode(), name.encode(), ctypes.byref(params))
        if status != 0:
            raise ModelLoadError(
                f"could not re-quantize {source.name} into {destination.parent}: {reason(str(status))}"
            )
        os.chmod(partial, 0o644)  # mkstemp makes it 0600
        os.replace(partial, destination)
    except BaseException:  # no partial file stays behind
        partial.unlink(missing_ok=True)
        raise
    return destination


def convert_to_f16(source: Path, destination: Path, *, n_threads: int | None = None) -> Path:
    """Re-quantize a GGUF to F16 (e.g. to get a memory-bound verifier for benchmarks)."""
    return requantize(source, destination, ftype=llama_cpp.LLAMA_FTYPE_MOSTLY_F16, n_threads=n_threads)
