"""Where the drafts derived from a user's draft file live: the cache folder (files/assets.py's
`DERIVED_DRAFTS`), named by the source's SHA-256 and the variant's name (drafts/made.py makes
them), and beside them the verifier's counted answers a hot vocabulary ranks by.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .assets import DERIVED_DRAFTS, cache_dir
from .stamps import sha256_hex, stamped_sha256, write_stamp


def derived_path(source: Path, name: str, verifier: Path | None = None) -> Path:
    """Where the variant `name` of `source` lives: the cache folder, by the source's SHA-256 (hashed
    once; a stamp beside the cache remembers it while the file's size and mtime stay the same), and
    for a hot vocabulary counted on a verifier's answers, that verifier (its name and size)."""
    folder = cache_dir() / DERIVED_DRAFTS
    stamp = folder / f"{hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:24]}.sha256"
    digest = stamped_sha256(source, stamp=stamp)
    if digest is None:
        digest = sha256_hex(source)
        write_stamp(source, digest, stamp=stamp)
    if verifier is None:
        return folder / f"{digest[:24]}-{name}.gguf"
    return folder / f"{digest[:24]}-{name}-for-{verifier_id(verifier)}.gguf"


def verifier_id(verifier: Path) -> str:
    return hashlib.sha256(f"{verifier.name}|{verifier.stat().st_size}".encode()).hexdigest()[:12]


def counts_path(verifier: Path) -> Path:
    """Where the tokens `verifier` wrote on the hot-vocabulary calibration set are kept."""
    return cache_dir() / DERIVED_DRAFTS / f"written-by-{verifier_id(verifier)}.npy"
