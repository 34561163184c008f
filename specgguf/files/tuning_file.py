"""tuning.json on disk (tuning.py reads its entries into typed values): where it is, how it is read, and
how it is changed.

It is read only as a small regular file (small_files.py: a FIFO in its place never blocks, and JSON
nested past `MAX_DEPTH` is refused as damaged, so what is written back is never too deep for
`json.dump`). It is changed under `tuning.json.lock`, opened without waiting and used only when it is a
regular file: a FIFO or a device there is an OSError, which every writer turns into a warning.

A damaged file is never fatal: each problem is one warning and the entry is ignored; a file
that cannot be parsed is kept as tuning.json.damaged when it is next written.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: no lock there
    fcntl = None  # type: ignore[assignment]

from .paths import config_dir
from .small_files import FileRefused, file_kind, read_json

MAX_BYTES = 16 << 20  # a machine's entries are a few KiB; thousands of machines and pairs fit
MAX_DEPTH = 16  # machine → key → entry → candidates → candidate: five levels are used


def machine_id() -> str:
    """What makes a measurement transferable: host, processor and core count."""
    return f"{platform.node()}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}"


def tuning_path() -> Path:
    return config_dir() / "tuning.json"


_warned: set[str] = set()


def warn(problem: str) -> None:
    """One line on stderr, once per problem: a damaged tuning.json is ignored, never fatal."""
    if problem not in _warned and sys.stderr is not None:
        _warned.add(problem)
        sys.stderr.write(f"specgguf: warning: {tuning_path()}: {problem}; ignored (`specgguf bench` rewrites it)\n")


def load_tuning() -> dict | None:
    """tuning.json's contents; {} if there is none; None if it is there but not a JSON object."""
    try:
        data = read_json(tuning_path(), max_bytes=MAX_BYTES, max_depth=MAX_DEPTH)
    except FileNotFoundError:
        return {}
    except FileRefused as refused:
        warn(f"cannot be read: {refused}")
        return None
    except (OSError, UnicodeDecodeError) as error:
        warn(f"cannot be read ({error})")
        return None
    except ValueError as error:
        warn(f"not valid JSON ({error})")
        return None
    if not isinstance(data, dict):
        warn("not a JSON object")
        return None
    return data


def machine_entries() -> dict:
    """This machine's entries ({} when there are none or they are not an object)."""
    entries = (load_tuning() or {}).get(machine_id(), {})
    if not isinstance(entries, dict):
        warn("this machine's entry is not an object")
        return {}
    return entries


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold tuning.json.lock (flock) around a read-modify-write: two processes storing at once keep both.
    Opened without waiting (a FIFO's open would wait for a reader); an OSError unless a regular file."""
    lock_path = path.with_name(path.name + ".lock")
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{lock_path} is {file_kind(mode)}, not a regular file: remove it")
        if fcntl is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def update_tuning(update: Callable[[dict], None]) -> None:
    """Read, change and write back tuning.json, under a lock: to a temporary file, then renamed, so a
    crash never truncates it (and a failed write leaves no temporary file behind)."""
    path = tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = load_tuning()
        if data is None:  # unreadable: keep it beside the new one rather than overwrite it
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, path.with_name(path.name + ".damaged"))
                sys.stderr.write(f"specgguf: warning: kept the damaged {path} as {path.name}.damaged\n")
            data = {}
        if not isinstance(data.get(machine_id(), {}), dict):
            data[machine_id()] = {}
        update(data)
        descriptor, name = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with open(descriptor, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=1)
            os.replace(name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
