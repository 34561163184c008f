"""A model's KV cache for its one sequence as bytes (llama_state_seq_get_data / set_data), so the
server can park a conversation and bring it back later without evaluating it again."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp

from ..errors import DecodeError


def save_sequence(ctx: Any) -> bytes:
    """Sequence 0's cells (keys, values, positions) as bytes."""
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)
    return bytes(memoryview(buffer)[:written])


def load_sequence(ctx: Any, state: bytes, name: str) -> None:
    """Put saved cells back as sequence 0 (the caller has emptied the cache first)."""
    if not state:
        return
    buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if llama_cpp.llama_state_seq_set_data(ctx, buffer, len(state), 0) == 0:
        raise DecodeError(f"{name}: llama.cpp could not restore a saved conversation's cache")
