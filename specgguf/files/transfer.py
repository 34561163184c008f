"""A resumable, verified HTTP download into `<destination>.incomplete`, renamed into place when whole.

The partial file survives interruptions (Ctrl-C, a dropped connection, a reboot): the
next attempt hashes what is there and asks for the rest with an HTTP Range request.
Bytes are flushed as they arrive, so nothing received is lost. Only a file whose size
and SHA-256 match becomes `destination`; one that does not match is deleted.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import get_session, hf_raise_for_status

from ..errors import AssetError, HubUnreachableError
from .stamps import sha256_digest

Progress = Callable[[str, int, "int | None"], None]  # (what is happening, bytes done, bytes total)
_RETRIES = 5  # attempts in a row that bring no new bytes, before giving up (the partial file stays)
_TIMEOUT = float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10)


class _RetryableStatus(Exception):
    """A 5xx or 429 answer in the middle of a download: worth another try."""


class _Partial:
    """`<destination>.incomplete`: the bytes so far and their running SHA-256. It survives interruptions."""

    def __init__(self, path: Path, size: int | None, progress: Progress | None):
        self.path, self.digest, self.done = path, hashlib.sha256(), 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file() and size is not None and path.stat().st_size > size:
            path.unlink()  # not a prefix of this file
        if path.is_file():  # hash what is there, to check the whole file at the end
            on_block = (lambda done: progress("checking partial download", done, size)) if progress else None
            self.digest, self.done = sha256_digest(path, on_block), path.stat().st_size
        self.handle = path.open("ab")

    def reset(self) -> None:
        self.handle.truncate(0)
        self.handle.seek(0)
        self.digest, self.done = hashlib.sha256(), 0

    def append(self, chunk: bytes) -> None:
        self.handle.write(chunk)
        self.handle.flush()  # on disk as it arrives: an interruption keeps all of it
        self.digest.update(chunk)
        self.done += len(chunk)


def fetch(
    url: str,
    destination: Path,
    *,
    name: str,
    size: int | None,
    sha256: str | None,
    headers: dict,
    progress: Progress | None,
) -> None:
    """Download `url` to `destination`, resuming `destination.incomplete` if an earlier attempt left one."""
    partial = _Partial(destination.with_name(destination.name + ".incomplete"), size, progress)
    try:
        failures = 0
        while size is None or partial.done < size:
            before = partial.done
            try:
                size = _stream(url, partial, size, headers, progress)
                if size is None or partial.done >= size:
                    break
                reason = "the server ended the transfer early"
            except httpx2.TooManyRedirects:
                raise HubUnreachableError(
                    f"downloading {name}: the server redirects in a loop; try again later"
                ) from None
            except (httpx2.RequestError, _RetryableStatus) as error:
                reason = str(error) or type(error).__name__
            failures = 0 if partial.done > before else failures + 1
            if failures >= _RETRIES:
                raise HubUnreachableError(
                    f"downloading {name} stopped at {partial.done} of {size} bytes ({reason});"
                    " run the same command again to resume"
                )
            time.sleep(min(0.2 * 2**failures, 5.0))
    finally:
        partial.handle.close()
    actual = partial.digest.hexdigest()
    if size is not None and partial.done != size:
        partial.path.unlink()
        raise AssetError(f"downloaded {name} has {partial.done} bytes, expected {size}: it was removed")
    if sha256 is not None and actual != sha256:
        partial.path.unlink()
        raise AssetError(
            f"downloaded {name} has SHA-256 {actual}, expected {sha256}: it was removed;"
            " pull again (if it fails again, the file changed upstream)"
        )
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(partial.path, 0o666 & ~umask)
    os.replace(partial.path, destination)


def _stream(url: str, partial: _Partial, size: int | None, headers: dict, progress: Progress | None) -> int | None:
    """One GET from where the partial file ends; returns the file's size once known."""
    request_headers = {**headers, "Accept-Encoding": "identity"}
    if partial.done:
        request_headers["Range"] = f"bytes={partial.done}-"
    with get_session().stream("GET", url, headers=request_headers, follow_redirects=True, timeout=_TIMEOUT) as response:
        if response.status_code >= 500 or response.status_code == 429:
            raise _RetryableStatus(f"HTTP {response.status_code}")
        try:
            hf_raise_for_status(response)
        except HfHubHTTPError as error:
            raise AssetError(
                f"the download failed: HTTP {response.status_code} from {url}; run the same command again to resume"
            ) from error
        if partial.done and response.status_code != 206:
            partial.reset()  # the server ignored the Range: start over
        length = response.headers.get("Content-Length", "")
        if size is None and length.isdigit():  # anything else: read to the end, sized as it comes
            size = partial.done + int(length)
        for chunk in response.iter_bytes():  # as it arrives: a dropped connection loses nothing
            partial.append(chunk)
            if progress:
                progress("downloading", partial.done, size)
    return size
