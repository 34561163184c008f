"""A GGUF's metadata, read from its header without touching the weights, and a vocabulary fingerprint.

The `gguf` package reads headers too, but builds an object per array element, which for a
150 000-token vocabulary is many times slower than this walk (scripts/autodraft_scan.py). A summary (the tokenizer's
scalars and a fingerprint of its token texts) is kept in the cache folder per file (by path,
size and modification time), so that scanning 50 local files again takes milliseconds.

The fingerprint decides llama.cpp's token-text rule (identical texts from id 5 over the shared
ids) without the texts: `prefix[i]` is a digest of the texts of ids 5 .. 5 + 64·i, and `tail`
keeps the last 192 texts; two vocabularies within 128 ids of each other agree exactly when the
digests at the last step inside the shared ids agree and the texts after it do.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError, terminal_safe
from .assets import cache_dir
from .small_files import read_json

START, STEP, TAIL = 5, 64, 192  # llama.cpp compares from id 5; sizes may differ by up to 128
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_WANTED = {
    "general.architecture",
    "general.name",
    "general.basename",
    "general.size_label",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
}
MAX_HEADER = 512 << 20  # metadata larger than this is not a model header
MAX_KEYS = 1 << 16  # metadata keys (a model has a few dozen)
MAX_INDEX_BYTES = 64 << 20  # vocab-index.json: ~50 kB a model; a larger one is read as empty (and rebuilt)
MAX_STRINGS = 1 << 21  # entries of a string array: tokens, merges (the largest vocabularies have ~260 000)
_SMALLEST_KEY = 8 + 4 + 1  # a key's length, its value type, a one-byte value


class HeaderError(ModelLoadError):
    """Not a GGUF file, or one whose header is cut short or malformed."""


class _Reader:
    """Reads a header front to back; every length and count is checked against what the file holds
    (and MAX_HEADER) before anything is read or skipped, so a claim cannot cost more than the bytes behind it."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("rb")
        self.path = path
        self.size = os.fstat(self.file.fileno()).st_size
        self.at = 0

    def _fits(self, n: int, what: str) -> None:
        if n < 0 or self.at + n > min(self.size, MAX_HEADER):
            cut = self.at + n > self.size
            raise HeaderError(
                f"{self.path}: the GGUF header is cut short ({what} runs past the end of the file)"
                if cut
                else f"{self.path}: a malformed GGUF header ({what} of {n} bytes)"
            )

    def take(self, n: int, what: str = "a value") -> bytes:
        self._fits(n, what)
        data = self.file.read(n)
        if len(data) != n:
            raise HeaderError(f"{self.path}: the GGUF header is cut short")
        self.at += n
        return data

    def skip(self, n: int, what: str) -> None:
        self._fits(n, what)
        self.file.seek(n, os.SEEK_CUR)
        self.at += n

    def count(self, n: int, smallest: int, most: int, what: str) -> int:
        """A count of items of at least `smallest` bytes each, refused if the file cannot hold them."""
        if n > most or n * smallest > min(self.size, MAX_HEADER) - self.at:
            raise HeaderError(f"{self.path}: a malformed GGUF header ({what} claims {n:,} entries)")
        return n

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def string(self, what: str = "a string") -> bytes:
        return self.take(self.u64(), what)

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind not in _SCALAR:
            raise HeaderError(f"{self.path}: a malformed GGUF header (value type {kind})")
        fmt = _SCALAR[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def array(self, key: str, keep: bool) -> list | None:
        kind, count = self.u32(), self.u64()
        what = terminal_safe(key[:80])
        if kind == _STRING:
            count = self.count(count, 8, MAX_STRINGS, what)
            if keep:
                return [self.string(what) for _ in range(count)]
            for _ in range(count):
                self.skip(self.u64(), what)
            return None
        if kind not in _SCALAR:
            raise HeaderError(f"{self.path}: a malformed GGUF header (array of type {kind})")
        width = struct.calcsize(_SCALAR[kind])
        self.skip(width * self.count(count, width, MAX_HEADER, what), what)
        return None


def read_metadata(path: Path) -> tuple[dict[str, Any], list[bytes]]:
    """The wanted metadata values and the token texts, from the header alone."""
    reader = _Reader(path)
    with reader.file:
        if reader.take(4) != b"GGUF":
            raise HeaderError(f"{path}: not a GGUF file")
        version = reader.u32()
        if version < 2:
            raise HeaderError(f"{path}: GGUF version {version} is too old for llama.cpp")
        reader.u64()  # tensor count
        meta: dict[str, Any] = {}
        tokens: list[bytes] = []
        for _ in range(reader.count(reader.u64(), _SMALLEST_KEY, MAX_KEYS, "the metadata")):
            key = reader.string("a key").decode("utf-8", "replace")
            kind = reader.u32()
            if kind == _ARRAY:
                items = reader.array(key, keep=key == "tokenizer.ggml.tokens")
                if items is not None:
                    tokens = items
            else:
                value = reader.value(kind)
                if key in _WANTED:
                    meta[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return meta, tokens


@dataclass(frozen=True)
class VocabSummary:
    """What pairing needs of one file, without its token texts (those are in the fingerprint)."""

    size: int  # bytes on disk
    architecture: str
    name: str
    tokenizer: str  # tokenizer.ggml.model: llama, gpt2, ...
    n_vocab: int
    bos: int | None  # None: the key is absent (llama.cpp then uses the tokenizer's default)
    eos: int | None
    add_bos: bool | None
    add_eos: bool | None
    prefix: tuple[str, ...]  # digests of ids START .. START + STEP*i
    tail: tuple[str, ...]  # the last TAIL token texts, hex


def fingerprint(tokens: list[bytes]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    digest = hashlib.blake2b(digest_size=8)
    prefix = [digest.hexdigest()]
    for start in range(START, len(tokens) - STEP + 1, STEP):
        for token in tokens[start : start + STEP]:
            digest.update(len(token).to_bytes(4, "little") + token)
        prefix.append(digest.hexdigest())
    return tuple(prefix), tuple(token.hex() for token in tokens[-TAIL:])


def summarize(path: Path) -> VocabSummary:
    meta, tokens = read_metadata(path)
    prefix, tail = fingerprint(tokens)

    def number(key: str) -> int | None:
        value = meta.get(key)
        return value if type(value) is int else None

    def flag(key: str) -> bool | None:
        value = meta.get(key)
        return value if isinstance(value, bool) else None

    return VocabSummary(
        size=path.stat().st_size,
        architecture=str(meta.get("general.architecture", "")),
        name=str(meta.get("general.name") or meta.get("general.basename") or ""),
        tokenizer=str(meta.get("tokenizer.ggml.model", "")),
        n_vocab=len(tokens),
        bos=number("tokenizer.ggml.bos_token_id"),
        eos=number("tokenizer.ggml.eos_token_id"),
        add_bos=flag("tokenizer.ggml.add_bos_token"),
        add_eos=flag("tokenizer.ggml.add_eos_token"),
        prefix=prefix,
        tail=tail,
    )


def tail_texts(summary: VocabSummary, start: int, stop: int) -> list[bytes]:
    """Token texts of ids start..stop-1, which must lie in the summary's tail."""
    first = summary.n_vocab - len(summary.tail)
    return [bytes.fromhex(text) for text in summary.tail[start - first : stop - first]]


def index_path() -> Path:
    return cache_dir() / "vocab-index.json"


def _stored(entry: object) -> VocabSummary | None:
    """A summary as the index stored it, or None unless every field has its type and the lengths fit n_vocab."""
    if not isinstance(entry, dict) or set(entry) != {field.name for field in fields(VocabSummary)}:
        return None
    numbers, texts = (entry["size"], entry["n_vocab"]), (entry["architecture"], entry["name"], entry["tokenizer"])
    if not all(type(value) is int and value >= 0 for value in numbers) or not all(type(t) is str for t in texts):
        return None
    if not all(entry[key] is None or type(entry[key]) is int for key in ("bos", "eos")):
        return None
    if not all(entry[key] is None or type(entry[key]) is bool for key in ("add_bos", "add_eos")):
        return None
    prefix, tail, n_vocab = entry["prefix"], entry["tail"], entry["n_vocab"]
    if not isinstance(prefix, (list, tuple)) or len(prefix) != len(range(START, n_vocab - STEP + 1, STEP)) + 1:
        return None
    if not isinstance(tail, (list, tuple)) or len(tail) != min(TAIL, n_vocab):
        return None
    if not all(type(digest) is str for digest in prefix) or not all(_is_hex(text) for text in tail):
        return None
    return VocabSummary(**{**entry, "prefix": tuple(prefix), "tail": tuple(tail)})


def _is_hex(text: object) -> bool:
    if type(text) is not str:
        return False
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _describes_a_file(key: str, entry: object) -> bool:
    """Kept when saved: a well-formed entry for a file that is still there."""
    try:
        return _stored(entry) is not None and Path(key.rsplit("|", 2)[0]).exists()
    except (OSError, ValueError):  # a name with a NUL byte, or too long
        return False


class SummaryIndex:
    """Summaries by (resolved path, size, mtime), loaded once and saved if anything was added. The index is a
    cache: a damaged one (or entry) is read as empty, and the files it no longer describes are read again."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] = {}
        self.changed = False
        try:
            data = read_json(index_path(), max_bytes=MAX_INDEX_BYTES)
            if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("files"), dict):
                self.entries = data["files"]
        except (OSError, ValueError):
            pass

    def get(self, path: Path) -> VocabSummary:
        """The file's summary (HeaderError if it is not a readable GGUF)."""
        resolved = path.resolve()
        stat = resolved.stat()
        key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
        stored = _stored(self.entries.get(key))
        if stored is not None:
            return stored
        summary = summarize(resolved)
        self.entries[key] = asdict(summary)
        self.changed = True
        return summary

    def save(self) -> None:
        """Written atomically; a cache folder that cannot be written only costs the next scan time."""
        if not self.changed:
            return
        self.entries = {key: entry for key, entry in self.entries.items() if _describes_a_file(key, entry)}
        target = index_path()
        written = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, encoding="utf-8") as out:
                written = Path(out.name)
                json.dump({"version": 1, "files": self.entries}, out)
            os.replace(written, target)
            self.changed = False
        except OSError:
            if written is not None:
                written.unlink(missing_ok=True)
