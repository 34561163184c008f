"""Facts about files on disk, written once: a SHA-256, a "verified" stamp, a size as people read it.

A stamp records that a file had a given SHA-256 at a given size and mtime: while both are
unchanged the file is not hashed again (a multi-GB model is read once, not at every start). A stamp
is read only when it is a small regular file (small_files.py: a FIFO in its place never blocks) and
written whole, through a temporary file renamed onto it; one that cannot be read is no stamp.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .small_files import read_json

_BLOCK = 4 * 1024 * 1024
_MAX_STAMP_BYTES = 4096  # {"sha256": 64 hex digits, "size", "mtime_ns"}: about 120 bytes


def sha256_digest(path: Path, on_progress: Callable[[int], None] | None = None) -> hashlib._Hash:
    """The file's running SHA-256 (more bytes can still be added), read in 4 MiB blocks.

    `on_progress(bytes done)` is called after each block.
    """
    digest, done = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
            done += len(block)
            if on_progress:
                on_progress(done)
    return digest


def sha256_hex(path: Path, on_progress: Callable[[int], None] | None = None) -> str:
    return sha256_digest(path, on_progress).hexdigest()


def _recorded(path: Path, stamp: Path) -> tuple[Any, os.stat_result] | None:
    """What `stamp` says, and `path`'s status now; None when either cannot be read."""
    try:
        return read_json(stamp, max_bytes=_MAX_STAMP_BYTES, max_depth=1), path.stat()
    except (OSError, ValueError):
        return None


def is_stamped(path: Path, sha256: str, *, stamp: Path) -> bool:
    """True if `stamp` says `path` had this SHA-256 and the file has not changed since (size, mtime)."""
    if (found := _recorded(path, stamp)) is None:
        return False
    recorded, stat = found
    return recorded == {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def stamped_sha256(path: Path, *, stamp: Path) -> str | None:
    """The SHA-256 `stamp` recorded for `path`, if the file has not changed since (size, mtime)."""
    if (found := _recorded(path, stamp)) is None:
        return None
    recorded, stat = found
    if not isinstance(recorded, dict) or (recorded.get("size"), recorded.get("mtime_ns")) != (
        stat.st_size,
        stat.st_mtime_ns,
    ):
        return None
    digest = recorded.get("sha256")
    return (
        digest
        if isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        else None
    )


def write_stamp(path: Path, sha256: str, *, stamp: Path) -> None:
    """Record `path`'s SHA-256 with its size and mtime, written whole onto `stamp` (whatever was there)."""
    stat = path.stat()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=stamp.parent, prefix=f"{stamp.name}.", suffix=".tmp")
    try:
        os.chmod(name, 0o644)  # mkstemp makes it 0600; a stamp is like any other cache file
        with open(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}, handle)
        os.replace(name, stamp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def size_text(size: int | None) -> str:
    """Bytes in decimal units, one decimal: '1.1 GB', '494.0 MB', '512 B'; 'size unknown' for None."""
    if size is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
