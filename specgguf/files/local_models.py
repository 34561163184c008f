"""Every GGUF model already on this machine: specgguf's cache, the Hugging Face cache, Ollama, LM Studio.

Each comes with the reference that names it on the command line (`ollama:NAME:TAG`,
`lmstudio:P/R/F.gguf`, a pulled `OWNER/REPO/FILE.gguf`, or its path) and, where the store
knows it without hashing, its SHA-256 (Ollama's blob names, the hub's LFS blob names).
Nothing is read but folder listings and Ollama's manifests; a damaged entry is passed over.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import lmstudio, ollama
from .assets import DERIVED_DRAFTS, cache_dir
from .hub import HubFile, cached, hub_cache, lfs_sha256

Source = Literal["specgguf", "huggingface", "ollama", "lmstudio"]
MAX_DEPTH = 4  # folders below a snapshot or the cache that are searched


@dataclass(frozen=True)
class LocalModel:
    ref: str  # what -m/-md take for it
    path: Path
    source: Source
    sha256: str | None = None


def _gguf_files(root: Path, depth: int = MAX_DEPTH) -> Iterator[Path]:
    if depth < 0 or not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            yield from _gguf_files(entry, depth - 1)
        elif lmstudio.is_model_file(entry.name) and entry.is_file():
            yield entry


def _specgguf_cache() -> Iterator[LocalModel]:
    derived = cache_dir() / DERIVED_DRAFTS  # copies made from a draft found elsewhere: not models of their own
    for path in _gguf_files(cache_dir(), depth=1):
        if path.parent != derived:
            yield LocalModel(ref=str(path), path=path, source="specgguf")


def _hugging_face() -> Iterator[LocalModel]:
    root = hub_cache()
    if not root.is_dir():
        return
    for repo in sorted(root.glob("models--*--*")):
        owner_name = repo.name.removeprefix("models--").split("--", 1)
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        for snapshot in sorted(snapshots.iterdir()):
            for path in _gguf_files(snapshot):
                file = path.relative_to(snapshot).as_posix()
                if not path.resolve().is_relative_to(root.resolve()):
                    continue  # a link out of the cache: not one of its blobs
                repo_id = "/".join(owner_name)
                # The pulled name when it finds this very file (its main revision), else the path.
                ref = f"{repo_id}/{file}" if cached(HubFile(repo_id, file)) == path else str(path)
                yield LocalModel(ref=ref, path=path, source="huggingface", sha256=lfs_sha256(path))


def _ollama() -> Iterator[LocalModel]:
    for model in ollama.list_models():
        yield LocalModel(ref=model.ref, path=model.path, source="ollama", sha256=model.sha256)


def _lmstudio() -> Iterator[LocalModel]:
    for model in lmstudio.list_models():
        yield LocalModel(ref=model.ref, path=model.path, source="lmstudio")


def local_models() -> list[LocalModel]:
    """Every local model file once (the first name found for a file wins)."""
    seen: set[Path] = set()
    found = []
    for source in (_specgguf_cache, _hugging_face, _ollama, _lmstudio):
        try:
            models = list(source())
        except OSError:  # an unreadable folder: that source has nothing for us
            continue
        for model in models:
            real = model.path.resolve()
            if real not in seen:
                seen.add(real)
                found.append(model)
    return found
