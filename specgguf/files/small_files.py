"""Small files that are data (manifests, settings, caches, schemas), read so that no file can hang or sink us.

Only a regular file is read: it is opened without blocking (a FIFO's open would wait for a writer),
then refused unless `fstat` says it is a regular file, and refused past `max_bytes` (so `/dev/zero`
or a growing file is never read to the end). JSON nested past Python's recursion limit is a
`ValueError` like any other malformed JSON, not a `RecursionError`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class FileRefused(ValueError):
    """Not a regular file, or larger than the reader's cap; the message says which."""


def read_small(path: Path, *, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; OSError when it cannot be opened or read."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else ""
            raise FileRefused(f"{kind or 'not a regular file'} (only a regular file is read)")
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


def loads(data: bytes | str) -> Any:
    """`json.loads`, with nesting too deep to parse a ValueError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to be read") from None


def read_json(path: Path, *, max_bytes: int) -> Any:
    """A small regular file's JSON value (ValueError: refused or not JSON; OSError: unreadable)."""
    return loads(read_small(path, max_bytes=max_bytes))


def _size(count: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"
