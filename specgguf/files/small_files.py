"""Small files that are data (manifests, settings, caches, schemas), read so that no file can hang or sink us.

Only a regular file is read: it is opened without blocking (a FIFO's open would wait for a writer),
then refused unless `fstat` says it is a regular file, and refused past `max_bytes` (so `/dev/zero`
or a growing file is never read to the end). JSON nested past Python's recursion limit is a
`ValueError` like any other malformed JSON, not a `RecursionError`; a reader may cap the nesting
lower (`max_depth`), so that what it writes back is never too deep for `json.dump`.

A `.npy` array (`read_npy`) is read the same way, and its header (dtype, shape) is checked against
what the reader expects and against the file's size before anything is allocated: a header that
claims 10^12 entries is refused, never a MemoryError.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np


class FileRefused(ValueError):
    """Not a regular file, or larger than the reader's cap; the message says which."""


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor open for reading (a FIFO's open does not wait), and its status; FileRefused
    (the descriptor closed) unless it is a regular file."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise FileRefused(f"{file_kind(status.st_mode)} (only a regular file is read)")
    return descriptor, status


def read_small(path: Path, *, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; OSError when it cannot be opened or read."""
    descriptor, _ = _open_regular(path)
    try:
        blocks = []
        left = max_bytes + 1  # one byte more than allowed tells a file that is too large
        while left > 0 and (block := os.read(descriptor, min(left, 1 << 20))):
            blocks.append(block)
            left -= len(block)
    finally:
        os.close(descriptor)
    if left <= 0:
        raise FileRefused(f"over {_size(max_bytes)}")
    return b"".join(blocks)


def loads(data: bytes | str, *, max_depth: int | None = None) -> Any:
    """`json.loads`, with nesting too deep to parse (or deeper than `max_depth`) a ValueError."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to be read") from None
    if max_depth is not None and _depth(value) > max_depth:
        raise ValueError(f"nested more than {max_depth} deep")
    return value


def _depth(value: Any) -> int:
    """How deeply objects and lists nest in a JSON value (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(path: Path, *, max_bytes: int, max_depth: int | None = None) -> Any:
    """A small regular file's JSON value (ValueError: refused or not JSON; OSError: unreadable)."""
    return loads(read_small(path, max_bytes=max_bytes), max_depth=max_depth)


def read_npy(path: Path, *, dtype: type[np.generic], length: int) -> np.ndarray:
    """A regular `.npy` file holding `length` entries of `dtype` in one dimension (ValueError: refused, or
    another array, or a header that does not fit the file's size; OSError: unreadable). The header is
    checked before the data is allocated or read."""
    descriptor, status = _open_regular(path)
    with os.fdopen(descriptor, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, stored = read_header(handle)  # ValueError for a malformed header
        expected = np.dtype(dtype)
        if stored != expected or shape != (length,):
            raise ValueError(f"expected {expected} of shape ({length},), the header says {stored} of shape {shape}")
        if handle.tell() + length * expected.itemsize != status.st_size:
            raise ValueError(f"its header says {length} entries, the file holds {status.st_size} bytes")
        data = bytearray(length * expected.itemsize)  # writable, and read into in place
        if handle.readinto(data) != len(data):
            raise ValueError("shorter than its header says")
    return np.frombuffer(data, dtype=expected)


def _size(count: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"
