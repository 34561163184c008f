"""Paths built from remote or file data (hub headers, models.yaml, GGUF metadata) stay inside their root.

The rule: every path derived from data we did not write is validated first (`relative_parts`
refuses `..`, absolute paths and odd characters) and then resolved inside its root (`inside`),
so that neither a hostile hub nor a mistyped registry entry can write or link outside it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from ..errors import SpecggufError


def config_dir() -> Path:
    """specgguf's configuration folder: $XDG_CONFIG_HOME/specgguf, else ~/.config/specgguf (read now)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "specgguf"


_PART = re.compile(r"[\w.+=@ ()\[\]-]+")  # one path component: no separators, no control characters


class UnsafePathError(SpecggufError):
    """A name from remote or file data would leave its folder."""


def relative_parts(text: str) -> tuple[str, ...]:
    """`text` as a relative POSIX path's components, or UnsafePathError (`..`, `/x`, `a//b`, `\\`, ...)."""
    if not text or text.startswith("/") or "\\" in text or text != text.strip():
        raise UnsafePathError(f"{text!r} is not a relative path")
    parts = PurePosixPath(text).parts
    if len(parts) != text.count("/") + 1 or any(p in (".", "..") or not _PART.fullmatch(p) for p in parts):
        raise UnsafePathError(f"{text!r} is not a plain relative path (no '..', '.', empty or odd components)")
    return parts


def inside(root: Path, *names: str) -> Path:
    """root/names..., checked to resolve inside root (so a link planted in the cache cannot lead out)."""
    parts = [part for name in names for part in relative_parts(name)]
    path = root.joinpath(*parts)
    resolved_root = root.resolve()
    if not path.resolve().is_relative_to(resolved_root):
        raise UnsafePathError(f"{path} would resolve outside {root}")
    return path
