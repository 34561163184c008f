"""Fake Ollama stores and LM Studio folders, laid out as those tools lay them out, from real GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

CONFIG_LAYER = "application/vnd.docker.container.image.v1+json"
MODEL_LAYER = "application/vnd.ollama.image.model"


def place_blob(store: Path, source: Path) -> str:
    """`source` as a blob of the store (hard-linked where it can be: the default pair is GBs), its digest."""
    sha256 = hashlib.sha256()
    with source.open("rb") as file:
        while block := file.read(1 << 22):
            sha256.update(block)
    digest = sha256.hexdigest()
    blob = store / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        try:
            os.link(source, blob)
        except OSError:
            shutil.copyfile(source, blob)
    return f"sha256:{digest}"


def write_manifest(store: Path, name: str, tag: str, layers: list[dict], *, namespace: str = "library") -> Path:
    path = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"mediaType": CONFIG_LAYER, "digest": "sha256:" + "0" * 64, "size": 2}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": config,
        "layers": layers,
    }
    path.write_text(json.dumps(manifest))
    return path


def add_ollama_model(store: Path, name: str, tag: str, gguf: Path, *, namespace: str = "library") -> Path:
    """A model as `ollama pull` leaves it: a manifest naming a model layer and a template, their blobs."""
    digest = place_blob(store, gguf)
    template = store / "template.txt"
    template.write_text("{{ .Prompt }}")
    layers = [
        {"mediaType": MODEL_LAYER, "digest": digest, "size": gguf.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": place_blob(store, template), "size": 13},
    ]
    template.unlink()
    write_manifest(store, name, tag, layers, namespace=namespace)
    return store / "blobs" / digest.replace(":", "-")


def add_lmstudio_model(folder: Path, publisher: str, repo: str, gguf: Path) -> Path:
    target = folder / publisher / repo / gguf.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, target)
    return target
