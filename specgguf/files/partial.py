"""Files written whole or not at all: each through a partial file of its own beside it, renamed at the end.

The partial's name is unique (`<name>.<random>.incomplete`, `tempfile.mkstemp` in the same folder),
so two processes making the same file at once never write over each other's bytes, and the one that
finishes last renames a whole file onto a whole file. When writing fails, the partial is removed
(Ctrl-C included) and the error names the file; a full disk (or a file-size limit) also names the
disk's folder and what is free there, instead of a bare `[Errno 28]`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import AssetError
from .stamps import size_text

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class WriteError(AssetError):
    """A file could not be written where it belongs; the message names it (and the disk when full)."""


def write_error(destination: Path, error: OSError) -> WriteError:
    """The one-line error for `destination` that could not be written."""
    what = error.strerror or str(error)
    if error.errno in _FULL or error.errno is None:  # None: a short write (numpy's "N requested and M written")
        with contextlib.suppress(OSError):
            free = size_text(shutil.disk_usage(destination.parent).free)
            what += f"; the disk holding {destination.parent} has {free} free"
    return WriteError(f"could not write {destination}: {what} (nothing was left behind)")


def cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in `folder` (made if missing), or None when one can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return f"{folder} cannot be written ({error.strerror or error})"


@contextlib.contextmanager
def partial_file(destination: Path) -> Iterator[Path]:
    """A new, empty partial file beside `destination` to write; renamed onto it when the block ends,
    removed when the block raises (an OSError becomes a WriteError naming `destination`)."""
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=destination.parent, prefix=f"{destination.name}.", suffix=".incomplete")
    except OSError as error:
        raise write_error(destination, error) from None
    os.close(descriptor)
    partial = Path(name)
    try:
        yield partial
        os.chmod(partial, 0o644)  # mkstemp makes it 0600; a cache file is like any other
        os.replace(partial, destination)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise write_error(destination, error) from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
