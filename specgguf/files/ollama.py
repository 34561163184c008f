"""Ollama's model store, read in place: `ollama:NAME[:TAG]` -> the GGUF blob of its model layer.

The layout is Ollama's own (ollama/ollama: manifest/paths.go, types/model/name.go):
`$OLLAMA_MODELS` (else `~/.ollama/models`) holds `manifests/HOST/NAMESPACE/MODEL/TAG` (JSON,
defaults `registry.ollama.ai`, `library`, `latest`) and `blobs/sha256-<64 hex>`. A manifest is
file data: its name parts follow Ollama's grammar, each layer's digest must be `sha256:<64 hex>`,
the model layer's media type `application/vnd.ollama.image.model`, its blob a regular file
inside the store (no link out of it) of the size the manifest says, starting with GGUF's magic.
Anything else is refused with one line, before a byte outside the store is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError, terminal_safe
from .paths import UnsafePathError, inside
from .small_files import FileRefused, read_json

PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
ADAPTER_LAYER = "application/vnd.ollama.image.adapter"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MAX_MANIFEST_BYTES = 1 << 20  # Ollama's are a few hundred bytes
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
# Ollama's name grammar (types/model/name.go isValidPart): a first character that is alphanumeric or
# `_`, then these; so no part is `.`, `..` or holds a separator.
_PARTS = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}


class StoreError(ModelLoadError):
    """A reference into a local model store (Ollama, LM Studio) that is missing, malformed or hostile."""


def store_root() -> Path:
    """Ollama's models folder: $OLLAMA_MODELS (as Ollama reads it), else ~/.ollama/models."""
    configured = os.environ.get("OLLAMA_MODELS", "").strip().strip("\"'")
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    def __str__(self) -> str:
        """As Ollama shows it (DisplayShortest): the defaults left out."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{PREFIX}{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{PREFIX}{self.namespace}/{self.model}:{self.tag}"
        return f"{PREFIX}{self.model}:{self.tag}"


def parse_name(text: str) -> OllamaName:
    """`ollama:[[HOST/]NAMESPACE/]MODEL[:TAG]` (Ollama's ParseName) -> a checked name."""
    rest = text.removeprefix(PREFIX)
    tag = DEFAULT_TAG
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag = rest.rsplit(":", 1)
    pieces = rest.split("/")
    if len(pieces) > 3 or not all(pieces):
        raise StoreError(f"{terminal_safe(text)!r} is not an Ollama model name: write it as ollama:NAME[:TAG]")
    host, namespace, model = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(pieces)] + pieces
    name = OllamaName(host, namespace, model, tag)
    for kind, value in zip(_PARTS, name.parts):
        if not _PARTS[kind].fullmatch(value):
            raise StoreError(
                f"{terminal_safe(text)!r} is not an Ollama model name (its {kind} {terminal_safe(value)!r}"
                " breaks Ollama's naming rules)"
            )
    return name


def _inside_store(store: Path, path: Path, what: str) -> Path:
    if not path.resolve().is_relative_to(store.resolve()):
        raise StoreError(f"{what} leads outside the Ollama store ({store}): refusing to follow it")
    return path


def _read_manifest(store: Path, name: OllamaName) -> dict:
    path = _inside_store(store, inside(store, "manifests").joinpath(*name.parts), f"the manifest of {name}")
    if not path.exists():
        raise StoreError(f"{name} is not in the Ollama store ({store}): `ollama pull {str(name)[len(PREFIX) :]}`")
    try:
        data = read_json(path, max_bytes=MAX_MANIFEST_BYTES)
    except FileRefused as refused:
        raise StoreError(f"the manifest of {name} ({path}) is {refused}: not an Ollama manifest") from None
    except ValueError as error:
        reason = terminal_safe(str(error).splitlines()[0] if str(error) else "")
        raise StoreError(f"the manifest of {name} ({path}) is not JSON ({reason}): the store is damaged") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise StoreError(f"the manifest of {name} ({path}) has no list of layers: not an Ollama manifest")
    return data


def _blob(store: Path, name: OllamaName, layer: dict) -> Path:
    """The layer's blob, every manifest field checked before it becomes a path."""
    digest, size = layer.get("digest"), layer.get("size")
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        shown = terminal_safe(repr(digest)[:80])
        raise StoreError(f"the manifest of {name} gives {shown} as a digest, not sha256:<64 hex>: refusing it")
    if type(size) is not int or size < 0:
        raise StoreError(f"the manifest of {name} gives no valid size for its model layer: refusing it")
    try:
        blob = inside(store, "blobs", f"sha256-{match.group(1)}")
    except UnsafePathError:
        raise StoreError(f"the model blob of {name} leads outside the Ollama store ({store}): refusing it") from None
    if not blob.is_file():
        raise StoreError(f"the model blob of {name} is missing from {store / 'blobs'}: `ollama pull` it again")
    if blob.stat().st_size != size:
        raise StoreError(
            f"the model blob of {name} has {blob.stat().st_size} bytes, its manifest says {size}: the store is damaged"
        )
    with blob.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise StoreError(f"the model layer of {name} is not a GGUF file: specgguf runs GGUF models only")
    return blob


def resolve(text: str, *, store: Path | None = None) -> Path:
    """`ollama:NAME[:TAG]` -> its model layer's blob, in place (nothing is copied)."""
    store = store or store_root()
    name = parse_name(text)
    layers = _read_manifest(store, name)["layers"]
    if not all(isinstance(layer, dict) for layer in layers):
        raise StoreError(f"the manifest of {name} has a layer that is not an object: not an Ollama manifest")
    media = [layer.get("mediaType") for layer in layers]
    if ADAPTER_LAYER in media:
        raise StoreError(f"{name} applies a LoRA adapter to its model, which specgguf does not load")
    models = [layer for layer in layers if layer.get("mediaType") == MODEL_LAYER]
    if not models:
        kinds = ", ".join(sorted({terminal_safe(str(kind)) for kind in media})) or "none"
        raise StoreError(f"{name} has no GGUF model layer ({MODEL_LAYER}; its layers: {kinds})")
    return _blob(store, name, models[0])


@dataclass(frozen=True)
class StoredModel:
    ref: str  # ollama:NAME:TAG
    path: Path
    sha256: str  # the blob's name: Ollama's content address


def list_models(*, store: Path | None = None) -> Iterator[StoredModel]:
    """Every model in the store that resolves cleanly; a damaged or hostile entry is passed over."""
    store = store or store_root()
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for folder, dirs, files in os.walk(manifests):  # links are not followed
        depth = len(Path(folder).relative_to(manifests).parts)
        if depth >= 3:
            dirs.clear()
        if depth != 3:
            continue
        host, namespace, model = Path(folder).relative_to(manifests).parts
        for tag in sorted(files):
            text = str(OllamaName(host, namespace, model, tag))
            try:
                path = resolve(text, store=store)
            except (StoreError, UnsafePathError, OSError):
                continue
            yield StoredModel(ref=text, path=path, sha256=path.name.removeprefix("sha256-").lower())
