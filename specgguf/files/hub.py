"""Hugging Face downloads into huggingface_hub's own cache: resumable across runs, SHA-256 checked.

Files land where `hf_hub_download` puts them: `blobs/<etag>` under
`$HF_HUB_CACHE/models--OWNER--NAME/`, linked from `snapshots/<commit>/<file>`, with
`refs/<revision>` naming the commit. So files other tools pulled are reused, and ours
serve them. huggingface_hub finds the file (`get_hf_file_metadata`, which follows the
hub's redirects) and reads the cache (`try_to_load_from_cache`); the bytes are fetched
here because since huggingface_hub 1.x `hf_hub_download` writes each attempt to a fresh
temporary file and deletes it on failure, so an interrupted multi-GB download starts
over (huggingface/huggingface_hub#4196). We keep `blobs/<etag>.incomplete` instead and
resume it with an HTTP Range request, hashing as we go. It becomes the blob only once
its size and SHA-256 match: a file that looks complete is always a verified one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx2
from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import WeakFileLock, build_hf_headers

from ..errors import AssetError, HubUnreachableError
from .assets import cache_dir
from .paths import UnsafePathError, inside
from .stamps import is_stamped, sha256_hex, write_stamp
from .transfer import Progress, fetch

_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")  # a commit, or the ETag of a file kept in git rather than LFS
_TIMEOUT = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 10)


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    revision: str | None = None  # None: main
    sha256: str | None = None
    size: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.repo}/{self.file}" + (f" at {self.revision}" if self.revision else "")


def hub_cache() -> Path:
    """huggingface_hub's cache folder, read from the environment now (its own constants are read at import)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.path.expandvars(os.environ[name])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return any(
        os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def cached(file: HubFile) -> Path | None:
    """The file's path in the hub cache, or None (no network)."""
    try:
        found = try_to_load_from_cache(file.repo, file.file, cache_dir=hub_cache(), revision=file.revision)
    except HFValidationError:  # not a valid repo id or revision: nothing of it can be cached
        return None
    return Path(found) if isinstance(found, str) else None


def snapshot_commit(path: Path) -> str | None:
    """The commit of a `snapshots/<commit>/...` path."""
    parts = path.parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else None


def lfs_sha256(path: Path) -> str | None:
    """The SHA-256 a cached file's blob is named by (the hub's LFS ETag), if it is one."""
    name = path.resolve().name
    return name if _SHA256.fullmatch(name) else None


# --- verification: a SHA-256 is checked once, then remembered by size and mtime ---------
def _stamp_path(sha256: str) -> Path:
    return cache_dir() / "verified" / sha256


def verify_cached(path: Path, sha256: str | None, progress: Progress | None = None) -> bool:
    """True if the cached file is `sha256` (else the LFS SHA-256 its blob is named by), checked once.

    With neither, its SHA-256 cannot be established: False (it is downloaded again, verified).
    A blob named by another SHA-256 is another version of the file: left alone, False.
    A blob whose bytes do not match is damaged: its snapshot link and the blob are
    removed, so that nothing complete-looking is left, and False.
    """
    blob, named = path.resolve(), lfs_sha256(path)
    if sha256 and named and named != sha256:
        return False
    expected = sha256 or named
    if expected is None:  # nothing to check it against: never passes as verified
        return False
    if is_stamped(blob, expected, stamp=_stamp_path(expected)):
        return True
    total = blob.stat().st_size
    on_block = (lambda done: progress("verifying", done, total)) if progress else None
    if sha256_hex(blob, on_block) == expected:
        write_stamp(blob, expected, stamp=_stamp_path(expected))
        return True
    path.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)
    return False


# --- the download ------------------------------------------------------------------------
def download(file: HubFile, *, progress: Progress | None = None) -> Path:
    """The file's path in the hub cache: reused if there and intact, else downloaded (resuming)."""
    found = cached(file)
    if found is not None and verify_cached(found, file.sha256, progress):
        return found
    if offline():
        raise HubUnreachableError(
            f"{file.ref} is not in the Hugging Face cache ({hub_cache()}) and"
            " HF_HUB_OFFLINE is set: unset it to download"
        )
    endpoint = hub_endpoint()
    meta = _metadata(file, endpoint)
    etag_sha256 = meta.etag if _SHA256.fullmatch(meta.etag) else None
    expected = file.sha256 or etag_sha256
    if expected is None:
        raise AssetError(
            f"{file.ref}: the hub gives no SHA-256 for this file (ETag {meta.etag}), so it"
            " cannot be verified; add its sha256 to models.yaml to pull it; nothing was downloaded"
        )
    if file.sha256 and etag_sha256 and etag_sha256 != file.sha256:
        raise AssetError(
            f"{file.ref}: the hub's file has SHA-256 {etag_sha256}, the registry expects"
            f" {file.sha256}: it changed upstream or the entry is wrong; nothing was downloaded"
        )
    if file.size and meta.size and meta.size != file.size:
        raise AssetError(
            f"{file.ref}: the hub's file has {meta.size} bytes, the registry expects {file.size};"
            " nothing was downloaded"
        )
    # Every name below comes from the registry or the hub's headers: each is checked to stay inside the cache.
    try:
        storage = inside(hub_cache(), repo_folder_name(repo_id=file.repo, repo_type="model"))
        pointer = inside(storage, "snapshots", meta.commit_hash, file.file)
        blob = inside(storage, "blobs", meta.etag)
        lock = inside(hub_cache(), ".locks", storage.name, f"{meta.etag}.lock")
        ref = inside(storage, "refs", file.revision or "main")
    except UnsafePathError as error:
        raise AssetError(
            f"{file.ref}: refusing a path outside the Hugging Face cache ({error}); nothing was written"
        ) from None
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if blob.is_file():
            verify_cached(blob, expected, progress)  # removes it if it is not the file
        if not blob.is_file():
            headers = build_hf_headers()
            if urlparse(meta.location).netloc != urlparse(endpoint).netloc:
                headers.pop("authorization", None)  # a CDN link is already signed
            fetch(
                meta.location, blob, name=file.ref, size=meta.size, sha256=expected, headers=headers, progress=progress
            )
            write_stamp(blob, expected, stamp=_stamp_path(expected))
        _link(blob, pointer)
        if (file.revision or "main") != meta.commit_hash:
            _write_ref(ref, meta.commit_hash)
    return pointer


def _metadata(file: HubFile, endpoint: str):
    url = hf_hub_url(file.repo, file.file, revision=file.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint, timeout=_TIMEOUT)
    except GatedRepoError:
        raise AssetError(
            f"{file.repo} is gated: accept its licence at {endpoint}/{file.repo}, then log in with `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise AssetError(f"repository {file.repo} was not found on {endpoint} (or it is private)") from None
    except RevisionNotFoundError:
        raise AssetError(f"revision {file.revision} of {file.repo} was not found on {endpoint}") from None
    except RemoteEntryNotFoundError:
        raise AssetError(
            f"{file.file} was not found in {file.repo} ({file.revision or 'main'}) on {endpoint}"
        ) from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        if status == 404:
            raise AssetError(f"{file.ref} was not found on {endpoint} (HTTP 404)") from None
        raise HubUnreachableError(
            f"the hub at {endpoint} answered HTTP {status} for {file.ref}: try again later"
        ) from None
    except httpx2.TooManyRedirects:
        raise HubUnreachableError(
            f"the hub at {endpoint} redirects {file.ref} in a loop: check HF_ENDPOINT or try again later"
        ) from None
    except httpx2.RequestError as error:
        raise HubUnreachableError(
            f"cannot reach the Hugging Face hub at {endpoint} ({error or type(error).__name__}):"
            " check the connection and HF_ENDPOINT; models already pulled still run"
        ) from None
    if meta.commit_hash is None or meta.etag is None:
        raise HubUnreachableError(
            f"{endpoint} does not answer like a Hugging Face hub (no commit or ETag for {file.ref}): check HF_ENDPOINT"
        )
    # Both become file names in the cache: only hex digests are accepted, never a path.
    if not _GIT_SHA1.fullmatch(meta.commit_hash):
        raise AssetError(
            f"{endpoint} sent {_shown(meta.commit_hash)} as the commit of {file.ref}, not a"
            " 40-digit hex hash: refusing it; nothing was written"
        )
    if not (_SHA256.fullmatch(meta.etag) or _GIT_SHA1.fullmatch(meta.etag)):
        raise AssetError(
            f"{endpoint} sent {_shown(meta.etag)} as the ETag of {file.ref}, not a SHA-256"
            " (64 hex digits) or a git hash (40): refusing it; nothing was written"
        )
    if meta.size is not None and meta.size < 0:
        raise AssetError(f"{endpoint} sent a negative size for {file.ref}; nothing was written")
    return meta


def _shown(value: str) -> str:
    """A header value for a message: quoted, control characters escaped, cut short."""
    return repr(value[:80])


def _link(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks here (some Windows setups): move the blob, as huggingface_hub does
        os.replace(blob, pointer)


def _write_ref(ref: Path, commit: str) -> None:
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text() != commit:
        ref.write_text(commit)
