"""The session n-gram cache's file (`SessionNgrams.save` / `load`): an .npz of seven arrays, written
atomically and read back only after every check a file from elsewhere needs.

Files are read with `allow_pickle=False`, carry a format version and a key naming the tokenizer/pair they
were learned with, and are refused whole (NgramCacheError, one line saying why and that deleting the file
starts afresh) when anything about them is off: not a regular file, not a zip of exactly these arrays, a
header claiming more than MAX_FILE_BYTES or MAX_FILE_ENTRIES before any data is read, another dtype,
lengths that disagree, token ids outside the vocabulary, counts outside 1..MAX_COUNT.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..errors import SpecggufError

FORMAT_VERSION = 1
MAX_COUNT = 2**62  # counts are int64 on disk
MAX_FILE_BYTES = 1 << 30  # a file's arrays, uncompressed: a zip claiming more is not read
# Twice what a session writes (its default max_entries, 1M n-grams): a file claiming more (a few MB of zeros
# can) would take minutes and GBs to read, and is refused from its array headers alone.
MAX_FILE_ENTRIES = {"ngram_lengths": 2_000_000, "follower_tokens": 4_000_000}
# name -> (dtype kind, item size, ndim) of each array in a file
_ARRAYS: dict[str, tuple[str, int, int]] = {
    "version": ("i", 8, 0),
    "key": ("U", 0, 0),  # item size: any
    "ngram_lengths": ("i", 1, 1),  # n of each n-gram, oldest first
    "ngram_tokens": ("i", 4, 1),  # their tokens, concatenated
    "n_followers": ("i", 4, 1),  # how many distinct tokens followed each n-gram
    "follower_tokens": ("i", 4, 1),  # those tokens, concatenated; each n-gram's best one last
    "follower_counts": ("i", 8, 1),  # how often each followed
}


class NgramCacheError(SpecggufError):
    """An n-gram cache file is missing, unreadable, corrupt, truncated, or from another model pair."""


def write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` (a cache's, with its key) to `path`, atomically: a temporary file in the same folder,
    then os.replace; a failed write leaves the old file and no temporary one."""
    temp_name = None
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as temp:
            temp_name = temp.name
            np.savez(temp, **arrays)  # type: ignore[arg-type]  # the stub fears a key named allow_pickle
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except OSError as error:
        raise NgramCacheError(f"could not save the n-gram cache to {path}: {error.strerror or error}") from None
    finally:
        if temp_name is not None and os.path.exists(temp_name):
            with contextlib.suppress(OSError):
                os.unlink(temp_name)


def read(path: Path, *, key: str, min_n: int, max_n: int, n_vocab: int | None) -> dict[str, np.ndarray]:
    """The checked arrays of a file `write` wrote with this key, for n-grams of min_n..max_n tokens over a
    vocabulary of n_vocab (when given); NgramCacheError for anything else."""
    arrays = _read_arrays(path)
    problem = _check_dtypes(arrays)
    if problem:
        raise rejected(path, problem)
    if int(arrays["version"]) != FORMAT_VERSION:
        version = int(arrays["version"])
        raise rejected(path, f"format version {version}, this specgguf reads version {FORMAT_VERSION}")
    if str(arrays["key"]) != key:
        raise rejected(path, "learned with another model pair or tokenizer")
    problem = _check_consistent(arrays, min_n=min_n, max_n=max_n, n_vocab=n_vocab)
    if problem:
        raise rejected(path, problem)
    return arrays


def rejected(path: Path, reason: str) -> NgramCacheError:
    return NgramCacheError(f"n-gram cache {path}: {reason}; delete it to start afresh")


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz written by `write`, read without pickle and within MAX_FILE_BYTES: opened once
    without waiting (a FIFO's open would wait for a writer) and read only if a regular file; each array's
    header is checked against its size in the zip before its data is read or allocated."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NgramCacheError(f"n-gram cache {path}: no such file") from None
    except OSError as error:
        raise rejected(path, f"unreadable ({error.strerror or error})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a folder, a FIFO, a device
        os.close(descriptor)
        raise rejected(path, "not a regular file")
    expected = {f"{name}.npy" for name in _ARRAYS}
    try:
        with os.fdopen(descriptor, "rb") as handle, zipfile.ZipFile(handle) as archive:
            members = archive.infolist()
            if {member.filename for member in members} != expected or len(members) != len(expected):
                raise rejected(path, "not an n-gram cache (unexpected contents)")
            if sum(member.file_size for member in members) > MAX_FILE_BYTES:
                raise rejected(path, f"larger than {MAX_FILE_BYTES} bytes unpacked")
            if problem := next(filter(None, (_header_problem(archive, member) for member in members)), None):
                raise rejected(path, problem)
            return {name: np.lib.format.read_array(archive.open(f"{name}.npy"), allow_pickle=False) for name in _ARRAYS}
    except NgramCacheError:
        raise
    except (OSError, EOFError, ValueError, KeyError, MemoryError, zipfile.BadZipFile, zlib.error) as error:
        # BadZipFile: not a zip, truncated, or a bad CRC; ValueError: a pickled (object) array or a bad .npy header
        raise rejected(path, f"unreadable or corrupt ({type(error).__name__})") from None


def _header_problem(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> str | None:
    """Why an array's .npy header does not fit (more than MAX_FILE_ENTRIES, or not its data's size), or None."""
    name = member.filename.removesuffix(".npy")
    with archive.open(member) as data:
        version = np.lib.format.read_magic(data)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(data)
        size = member.file_size - data.tell()
    entries = math.prod(shape)  # Python ints: a claim of 2**62 entries cannot wrap
    if len(shape) == 1 and entries > MAX_FILE_ENTRIES.get(name, entries):
        return f"{entries} entries in {name}, more than the {MAX_FILE_ENTRIES[name]} a cache may hold"
    if entries * dtype.itemsize != size and not dtype.hasobject:  # pickled objects: read_array refuses them
        return f"the header of {name} claims {entries} entries, its data is {size} bytes"
    return None


def _check_dtypes(arrays: dict[str, np.ndarray]) -> str | None:
    """Why these arrays do not have the dtypes and dimensions of a cache's, or None if they do."""
    for name, (kind, itemsize, ndim) in _ARRAYS.items():
        array = arrays[name]
        if array.dtype.kind != kind or (itemsize and array.dtype.itemsize != itemsize) or array.ndim != ndim:
            return f"array {name} has dtype {array.dtype} and {array.ndim} dimensions"
    return None


def _check_consistent(arrays: dict[str, np.ndarray], *, min_n: int, max_n: int, n_vocab: int | None) -> str | None:
    """Why these arrays (of the right dtypes) are not a consistent cache for min_n..max_n, or None."""
    lengths, n_followers = arrays["ngram_lengths"], arrays["n_followers"]
    if len(lengths) != len(n_followers):
        return "n-gram lengths and follower counts disagree"
    if len(lengths) and (lengths.min() < min_n or lengths.max() > max_n):
        return f"it holds n-grams outside {min_n}..{max_n} tokens"
    if int(lengths.sum(dtype=np.int64)) != len(arrays["ngram_tokens"]):
        return "n-gram lengths and n-gram tokens disagree"
    if len(n_followers) and n_followers.min() < 1:
        return "an n-gram has no follower"
    n_follower_total = int(n_followers.sum(dtype=np.int64))
    if not n_follower_total == len(arrays["follower_tokens"]) == len(arrays["follower_counts"]):
        return "follower lengths disagree"
    for name in ("ngram_tokens", "follower_tokens"):
        if len(arrays[name]) and arrays[name].min() < 0:
            return f"negative token ids in {name}"
        if n_vocab is not None and len(arrays[name]) and arrays[name].max() >= n_vocab:
            return f"token id {int(arrays[name].max())} in {name}, past the model's vocabulary of {n_vocab}"
    counts = arrays["follower_counts"]
    if len(counts) and (counts.min() < 1 or counts.max() > MAX_COUNT):
        return f"follower counts outside 1..{MAX_COUNT}"
    return None
