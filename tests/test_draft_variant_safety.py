"""Hardening, round three (issue 36): draft variants. Two runs making the same variant at once both
succeed; `auto` with a cache it cannot write uses the draft as given; a full disk while a hot
vocabulary is written leaves nothing and names the file and the disk; a short id map is one line;
Ctrl-C while llama.cpp re-quantizes is exit 130 with one line, the partial file removed."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tiny_gguf import write_tiny_llama

# IQ4_NL's quantizer is slow (about a second for this draft on two cores): a window wide enough to
# send a signal into, or to overlap two runs in, without a timing race.
SLOW_VARIANT = "iq4_nl"


@pytest.fixture(scope="module")
def slow_to_quantize(tmp_path_factory) -> Path:
    """A draft of the tiny verifier's vocabulary, 17 MB of F32 weights."""
    folder = tmp_path_factory.mktemp("variants")
    return write_tiny_llama(folder / "draft.gguf", base_seed=7, n_embd=256, n_layer=4, n_head=4)


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A verifier and a draft of 20,000 tokens: room for a 16k hot vocabulary."""
    folder = tmp_path_factory.mktemp("wide")
    verifier = write_tiny_llama(folder / "verifier.gguf", base_seed=7, n_vocab=20_000)
    draft = write_tiny_llama(folder / "draft.gguf", base_seed=7, seed=1, noise=0.05, n_vocab=20_000)
    return verifier, draft


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def left_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.rglob("*") if path.is_file())


DERIVE_AT_THE_SIGNAL = """
import sys, time
from pathlib import Path
from specgguf.drafts import made
from specgguf.llama.variants import parse_variant
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
print(made.derive(Path(sys.argv[1]), parse_variant(sys.argv[3])))
"""


def test_two_runs_making_the_same_variant_at_once_both_succeed(cache, slow_to_quantize, tmp_path):
    go = tmp_path / "go"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", DERIVE_AT_THE_SIGNAL, str(slow_to_quantize), str(go), SLOW_VARIANT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for _ in range(2)
    ]
    time.sleep(2)  # both have imported llama.cpp and wait
    go.touch()
    made = set()
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err.decode()
        made.add(out.decode().strip())
    (path,) = made
    assert Path(path).read_bytes()[:4] == b"GGUF"
    assert not [name for name in left_in(cache) if name.endswith(".incomplete")]


def test_auto_with_a_cache_it_cannot_write_uses_the_draft_as_given(
    cli, tiny_verifier, tiny_draft, tmp_path, monkeypatch
):
    from specgguf.drafts import made

    monkeypatch.setattr(made, "MIN_DERIVED_BYTES", 0)  # the tiny draft counts as big enough
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SPECGGUF_CACHE", str(blocked / "cache"))
    result = cli("run", "-m", tiny_verifier, "-md", tiny_draft, "-n", "4", "--temp", "0", "--json", "the cat")
    assert result.returncode == 0, result.stderr
    report = __import__("json").loads(result.stdout)
    assert report["settings"]["model_draft"] == str(tiny_draft)
    assert blocked.read_text() == "a file where the cache folder should be"


def small_files(limit: int):
    """`ulimit -f`: a disk that fills after `limit` bytes of any one file (Python ignores SIGXFSZ: EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_while_a_hot_vocabulary_is_written_leaves_nothing_and_names_file_and_disk(cli, cache, wide_pair):
    verifier, draft = wide_pair
    args = ["run", "-m", verifier, "-md", draft, "--draft-variant", "original+hot16k", "-n", "4", "the cat"]
    result = cli.process(*args, preexec_fn=small_files(2 << 20), timeout=300)  # the copy is ~9 MB
    line = result.error_line()
    assert "could not write" in line and "-original+hot16k-for-" in line and ".gguf: " in line  # the model
    assert f"the disk holding {cache / 'drafts'} has" in line
    assert not [name for name in left_in(cache) if "hot16k" in name]


def test_an_id_map_with_half_the_ids_is_one_line(cli, cache, wide_pair):
    verifier, draft = wide_pair
    args = ["run", "-m", verifier, "-md", draft, "--draft-variant", "original+hot16k", "-n", "4", "the cat"]
    assert cli(*args).returncode == 0
    (maps,) = (cache / "drafts").glob("*.ids.npz")
    with np.load(maps) as data:
        ids, feed, row_type = data["ids"], data["feed"], data["row_type"]
    half = len(ids) // 2
    np.savez(maps, ids=ids[:half], feed=np.minimum(feed, half - 1), row_type=row_type)  # well-formed, short
    line = cli(*args).error_line()
    assert maps.name in line and f"{half} ids for the {len(ids)} tokens of its model" in line


def test_ctrl_c_while_a_variant_is_made_is_130_with_one_line_and_no_partial_file(
    cache, tiny_verifier, slow_to_quantize
):
    command = ["run", "-m", tiny_verifier, "-md", slow_to_quantize, "--draft-variant", SLOW_VARIANT, "the cat"]
    run = subprocess.Popen(
        [sys.executable, "-m", "specgguf", *map(str, command)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not list(cache.rglob("*.incomplete")):  # llama.cpp is writing the variant
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.005)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    stderr = err.decode()
    assert run.returncode == 130 and stderr.strip().splitlines()[-1] == "specgguf: error: interrupted", stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr and not out
    assert not [name for name in left_in(cache) if name.endswith((".incomplete", f"-{SLOW_VARIANT}.gguf"))]
