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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .assets import cache_dir

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


class HeaderError(ModelLoadError):
    """Not a GGUF file, or one whose header is cut short or malformed."""


class _Reader:
    def __init__(self, path: Path) -> None:
        self.file = path.open("rb")
        self.path = path

    def take(self, n: int) -> bytes:
        if n < 0 or n > MAX_HEADER:
            raise HeaderError(f"{self.path}: a malformed GGUF header (a length of {n})")
        data = self.file.read(n)
        if len(data) != n:
            raise HeaderError(f"{self.path}: the GGUF header is cut short")
        return data

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def string(self) -> bytes:
        return self.take(self.u64())

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind not in _SCALAR:
            raise HeaderError(f"{self.path}: a malformed GGUF header (value type {kind})")
        fmt = _SCALAR[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def array(self, keep: bool) -> list | None:
        kind, count = self.u32(), self.u64()
        if kind == _STRING:
            items = [self.string() for _ in range(count)] if keep else None
            if not keep:
                for _ in range(count):
                    self.file.seek(self.u64(), os.SEEK_CUR)
            return items
        if kind not in _SCALAR:
            raise HeaderError(f"{self.path}: a malformed GGUF header (array of type {kind})")
        self.file.seek(struct.calcsize(_SCALAR[kind]) * count, os.SEEK_CUR)
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
        for _ in range(reader.u64()):
            key = reader.string().decode("utf-8", "replace")
            kind = reader.u32()
            if kind == _ARRAY:
                items = reader.array(keep=key == "tokenizer.ggml.tokens")
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


class SummaryIndex:
    """Summaries by (resolved path, size, mtime), loaded once and saved if anything was added."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] = {}
        self.changed = False
        try:
            data = json.loads(index_path().read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("version") == 1 and isinstance(data.get("files"), dict):
                self.entries = data["files"]
        except (OSError, ValueError):
            pass

    def get(self, path: Path) -> VocabSummary:
        """The file's summary (HeaderError if it is not a readable GGUF)."""
        resolved = path.resolve()
        stat = resolved.stat()
        key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
        entry = self.entries.get(key)
        if isinstance(entry, dict):
            try:
                return VocabSummary(**{**entry, "prefix": tuple(entry["prefix"]), "tail": tuple(entry["tail"])})
            except (TypeError, KeyError):
                pass
        summary = summarize(resolved)
        self.entries[key] = asdict(summary)
        self.changed = True
        return summary

    def save(self) -> None:
        """Written atomically; a cache folder that cannot be written only costs the next scan time."""
        if not self.changed:
            return
        self.entries = {key: entry for key, entry in self.entries.items() if Path(key.rsplit("|", 2)[0]).exists()}
        target = index_path()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, encoding="utf-8") as out:
                json.dump({"version": 1, "files": self.entries}, out)
            os.replace(out.name, target)
            self.changed = False
        except OSError:
            pass
