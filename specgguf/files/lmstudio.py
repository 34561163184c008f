"""LM Studio's models folder, read in place: `lmstudio:PUBLISHER/REPO/FILE.gguf` -> the file.

Where the folder is, first found wins: `$SPECGGUF_LMSTUDIO_MODELS`; the `downloadsFolder` that
LM Studio's `settings.json` names (in its home: the folder `~/.lmstudio-home-pointer` names, else
`~/.lmstudio`, else the older `~/.cache/lm-studio`); that home's `models`. Files sit at
`PUBLISHER/REPO/FILE.gguf`. The reference is checked as a relative path (no `..`), and the file
must resolve inside the folder: a link out of it is refused, not followed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import terminal_safe
from .ollama import StoreError
from .paths import UnsafePathError, inside, relative_parts
from .small_files import read_json, read_small

PREFIX = "lmstudio:"
ENV = "SPECGGUF_LMSTUDIO_MODELS"
_LATER_SHARD = re.compile(r"-0*([2-9]|[1-9]\d+)-of-\d+\.gguf$", re.IGNORECASE)
MAX_SETTINGS_BYTES = 1 << 20  # LM Studio's settings.json is a few KiB
_warned: set[Path] = set()


def _warn_settings(path: Path, error: Exception) -> None:
    if path not in _warned and sys.stderr is not None:
        _warned.add(path)
        reason = terminal_safe(str(error).splitlines()[0] if str(error) else type(error).__name__)
        sys.stderr.write(f"specgguf: warning: {terminal_safe(str(path))}: {reason}; using LM Studio's default folder\n")


def _home() -> Path:
    pointer = Path.home() / ".lmstudio-home-pointer"
    try:
        named = read_small(pointer, max_bytes=MAX_SETTINGS_BYTES).decode("utf-8").strip() if pointer.exists() else ""
    except (OSError, ValueError):
        named = ""
    if named and Path(named).expanduser().is_dir():
        return Path(named).expanduser()
    for home in (Path.home() / ".lmstudio", Path.home() / ".cache" / "lm-studio"):
        if home.is_dir():
            return home
    return Path.home() / ".lmstudio"


def store_root() -> Path:
    """LM Studio's models folder (see the module's note), read from the environment and settings now."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    home = _home()
    try:
        settings = read_json(home / "settings.json", max_bytes=MAX_SETTINGS_BYTES)
    except FileNotFoundError:
        settings = None
    except (OSError, ValueError) as error:  # LM Studio's own file, damaged: its default folder, said once
        _warn_settings(home / "settings.json", error)
        settings = None
    folder = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    if isinstance(folder, str) and folder.strip():
        return Path(folder.strip()).expanduser()
    return home / "models"


def is_model_file(name: str) -> bool:
    """A GGUF that is a model to run: not a vision projector, not a later part of a split file."""
    lower = name.lower()
    return lower.endswith(".gguf") and not lower.startswith("mmproj") and not _LATER_SHARD.search(lower)


def _checked(store: Path, parts: tuple[str, ...], text: str) -> Path:
    try:
        return inside(store, *parts)
    except UnsafePathError:
        raise StoreError(
            f"{terminal_safe(text)} leads outside LM Studio's folder ({store}): refusing to follow it;"
            " give the file's own path with -m/-md instead"
        ) from None


def resolve(text: str, *, store: Path | None = None) -> Path:
    """`lmstudio:PUBLISHER/REPO/FILE.gguf` (or `PUBLISHER/REPO` holding one model file) -> the file."""
    store = store or store_root()
    rest = text.removeprefix(PREFIX)
    try:
        parts = relative_parts(rest)
    except UnsafePathError:
        parts = ()
    if len(parts) < 2:
        raise StoreError(
            f"{terminal_safe(text)!r} is not an LM Studio model: write it as lmstudio:PUBLISHER/REPO/FILE.gguf"
        )
    path = _checked(store, parts, text)
    if len(parts) == 2 or path.is_dir():
        if not path.is_dir():
            raise StoreError(f"{terminal_safe(text)} is not in LM Studio's folder ({store})")
        files = sorted(entry.name for entry in path.iterdir() if is_model_file(entry.name))
        if len(files) != 1:
            choices = ", ".join(f"{PREFIX}{rest}/{name}" for name in files) or "none there"
            raise StoreError(f"{terminal_safe(text)} holds {len(files)} model files: name one ({choices})")
        path = _checked(store, (*parts, files[0]), text)
    if not path.name.lower().endswith(".gguf"):
        raise StoreError(f"{terminal_safe(text)} is not a .gguf file: specgguf runs GGUF models only")
    if not path.is_file():
        raise StoreError(f"{terminal_safe(text)} is not in LM Studio's folder ({store})")
    with path.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise StoreError(f"{terminal_safe(text)} is not a GGUF file (no GGUF magic)")
    return path


@dataclass(frozen=True)
class StoredModel:
    ref: str  # lmstudio:PUBLISHER/REPO/FILE.gguf
    path: Path


def list_models(*, store: Path | None = None) -> Iterator[StoredModel]:
    """Every PUBLISHER/REPO/FILE.gguf that resolves inside the folder; anything else is passed over."""
    store = store or store_root()
    if not store.is_dir():
        return
    for publisher in sorted(store.iterdir()):
        if not publisher.is_dir() or publisher.is_symlink():
            continue
        for repo in sorted(publisher.iterdir()):
            if not repo.is_dir() or repo.is_symlink():
                continue
            for entry in sorted(repo.iterdir()):
                if not is_model_file(entry.name):
                    continue
                text = f"{PREFIX}{publisher.name}/{repo.name}/{entry.name}"
                try:
                    yield StoredModel(ref=text, path=resolve(text, store=store))
                except (StoreError, OSError):
                    continue
