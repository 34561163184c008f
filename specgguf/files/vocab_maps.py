"""Where a cross-vocabulary pair's vocabulary map is kept (drafts/cross_vocab.py builds and checks it): the
cache folder's derived drafts (files/assets.py's `DERIVED_DRAFTS`), named by both files (name, size
and modification time: a changed file gets a new map; a rebuild takes about a second).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .assets import DERIVED_DRAFTS, cache_dir
from .partial import partial_file
from .small_files import read_npy


def _file_id(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def vocab_map_path(draft: Path, verifier: Path) -> Path:
    return cache_dir() / DERIVED_DRAFTS / f"vocab-map-{_file_id(draft)}-for-{_file_id(verifier)}.npy"


def read_array(path: Path, *, length: int) -> np.ndarray | None:
    """The stored map, int32 with one entry per draft token (`length`); None when there is none.
    ValueError when the file is not such a map (damaged, a FIFO, a header that does not fit its size)."""
    try:
        return read_npy(path, dtype=np.int32, length=length)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(str(error)) from error


def write_array(path: Path, array: np.ndarray) -> None:
    with partial_file(path) as partial, partial.open("wb") as handle:
        np.save(handle, array, allow_pickle=False)
