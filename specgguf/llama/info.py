"""What a loaded model says about itself, for the server's model listings (Ollama's /api/tags,
/api/show) and for fill-in-the-middle prompts: its description and size, a few metadata values,
and its FIM tokens (llama_vocab_fim_pre/suf/mid, -1 where the vocabulary has none)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp


@dataclass(frozen=True)
class ModelInfo:
    description: str  # llama.cpp's "qwen2 1.5B Q8_0"
    architecture: str  # general.architecture
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_embd: int
    file_type: str = ""  # general.file_type's name, as llama.cpp's quantize names it: "Q4_K_M", "F16"


@dataclass(frozen=True)
class FimTokens:
    """The tokens that frame a fill-in-the-middle prompt; `sep`/`rep` (repository-level FIM) may be -1."""

    prefix: int
    suffix: int
    middle: int
    sep: int = -1
    rep: int = -1


def meta_value(model: Any, key: str) -> str | None:
    buffer = ctypes.create_string_buffer(256)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    if size >= len(buffer):
        buffer = ctypes.create_string_buffer(size + 1)
        size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode("utf-8", "replace") if size >= 0 else None


def model_info(model: Any) -> ModelInfo:  # a llama_model_p
    buffer = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, buffer, len(buffer))
    return ModelInfo(
        description=buffer.value.decode("utf-8", "replace"),
        architecture=meta_value(model, "general.architecture") or "",
        n_params=int(llama_cpp.llama_model_n_params(model)),
        size_bytes=int(llama_cpp.llama_model_size(model)),
        n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(model)),
        n_embd=int(llama_cpp.llama_model_n_embd(model)),
        file_type=file_type_name(meta_value(model, "general.file_type")),
    )


def file_type_name(value: str | None) -> str:
    """A GGUF's `general.file_type` (llama.cpp's llama_ftype, a number) as its name ("Q4_K_M");
    "" when the file does not say or the number is not one this llama.cpp knows."""
    names = {
        getattr(llama_cpp, name): name.removeprefix("LLAMA_FTYPE_MOSTLY_").removeprefix("LLAMA_FTYPE_ALL_")
        for name in dir(llama_cpp)
        if name.startswith(("LLAMA_FTYPE_MOSTLY_", "LLAMA_FTYPE_ALL_"))
    }
    return names.get(int(value), "") if value is not None and value.strip().isdigit() else ""


def fim_tokens(vocab: llama_cpp.llama_vocab_p) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks any of prefix, suffix and middle."""
    tokens = FimTokens(
        prefix=llama_cpp.llama_vocab_fim_pre(vocab),
        suffix=llama_cpp.llama_vocab_fim_suf(vocab),
        middle=llama_cpp.llama_vocab_fim_mid(vocab),
        sep=llama_cpp.llama_vocab_fim_sep(vocab),
        rep=llama_cpp.llama_vocab_fim_rep(vocab),
    )
    return tokens if min(tokens.prefix, tokens.suffix, tokens.middle) >= 0 else None
