"""Hardening, round four (issue 43): the files specgguf writes for itself (tuning.json and its lock, the
drafts cache's vocabulary maps and counts, stamps) are read only as small regular files and checked on
read. A FIFO in their place never blocks a run; a damaged one is one warning and ignored or rebuilt,
never a traceback. Where a FIFO could block, the case runs in a process with a timeout, so that a hang
fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specgguf.files.derived import counts_path
from specgguf.files.vocab_maps import vocab_map_path
from specgguf.tuning import machine_id
from tiny_gguf import write_tiny_llama

TIMEOUT = 120  # a run of the tiny pair takes seconds; one blocked on a FIFO would never end
DEEP = b"[" * 100_000 + b"]" * 100_000


def _tiny(verifier: Path, draft: Path) -> list:
    return ["-m", verifier, "-md", draft, "-c", "256", "-n", "8", "--seed", "1"]


def _run(cli, *args, env: dict[str, str] | None = None):
    """`specgguf run ARGS "the cat"` in a process: it finished, with exit 0 and no traceback."""
    result = cli.process("run", *args, "the cat", env=env, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


# --- tuning.json and its lock -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["tuning.json", "tuning.json.lock"])
def test_a_fifo_as_tuning_json_or_its_lock_never_blocks_a_run(cli, tiny_verifier, tiny_draft, config_home, name):
    fifo = config_home / "specgguf" / name
    os.mkfifo(fifo)  # every run blocked here: reading tuning.json, or locking it to keep the measured costs
    result = _run(cli, *_tiny(tiny_verifier, tiny_draft))
    assert f"{fifo}" in result.stderr and "a FIFO" in result.stderr
    assert "specgguf: warning:" in result.stderr


@pytest.fixture(scope="module")
def measured(cli, tiny_verifier, tiny_draft, tmp_path_factory) -> dict[str, list[float]]:
    """This machine's costs for the tiny pair, as a first run keeps them in tuning.json."""
    config = tmp_path_factory.mktemp("measured")
    _run(cli, *_tiny(tiny_verifier, tiny_draft), env={"XDG_CONFIG_HOME": str(config)})
    (entries,) = json.loads((config / "specgguf" / "tuning.json").read_text()).values()
    assert {key.split("|")[0] for key in entries} == {"verify_costs", "draft_costs", "draft_read"}
    return entries


DAMAGE = {
    "one entry": lambda costs: costs[:1],  # a verify table of one batch size: a ValueError, `serve` did not start
    "subnormal": lambda costs: [1e-320] * len(costs),  # "cannot convert float NaN to integer" in the K policy
    "over an hour": lambda costs: [7200.0] * len(costs),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_implausible_stored_costs_are_one_warning_and_measured_again(
    cli, tiny_verifier, tiny_draft, config_home, measured, damage
):
    path = config_home / "specgguf" / "tuning.json"
    path.write_text(json.dumps({machine_id(): {key: DAMAGE[damage](costs) for key, costs in measured.items()}}))
    result = _run(cli, *_tiny(tiny_verifier, tiny_draft), "-n", "30", "--temp", "0.8")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("specgguf: warning:")]
    assert warnings and all(str(path) in line and "from 1 µs to 1 h" in line for line in warnings), result.stderr
    assert "measuring this machine's costs" in result.stderr


def test_a_tuning_json_nested_100000_deep_is_a_warning_for_every_command(cli, tiny_verifier, tiny_draft, config_home):
    path = config_home / "specgguf" / "tuning.json"
    path.write_bytes(DEEP)
    for command in (["run", *_tiny(tiny_verifier, tiny_draft), "the cat"], ["check", tiny_draft, tiny_verifier]):
        result = cli.process(*command, timeout=TIMEOUT)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert f"{path}: not valid JSON (nested too deeply to be read); ignored" in result.stderr
    assert path.read_bytes() == DEEP  # reading never rewrites it


def test_tuning_json_nested_past_the_cap_is_ignored_and_kept_aside_when_written(config_home, capsys):
    from specgguf import tuning

    path = tuning.tuning_path()
    path.write_text('{"elsewhere": ' + "[" * 20 + "]" * 20 + "}")  # 21 deep: parsed, refused by the cap
    assert tuning.load_tuning() is None and "nested more than 16 deep" in capsys.readouterr().err
    tuning.store_measurement(Path("v.gguf"), Path("d.gguf"), 0.0, tuning.BenchResult(4, 1.3))
    assert tuning.stored_measurement(Path("v.gguf"), Path("d.gguf"), 0.0) == tuning.BenchResult(4, 1.3)
    assert path.with_name("tuning.json.damaged").is_file()


# --- the drafts cache: vocabulary maps, counted answers -------------------------------------
@pytest.fixture(scope="module")
def bpe_draft(tmp_path_factory) -> Path:
    """A draft of another vocabulary (byte-level BPE) for the tiny verifier (SentencePiece): it drafts through text."""
    return write_tiny_llama(tmp_path_factory.mktemp("bpe") / "bpe.gguf", base_seed=7, vocab_type="bpe")


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("which", ["vocabulary map", "counted answers"])
def test_a_fifo_in_the_drafts_cache_never_blocks_a_cross_vocabulary_run(
    cli, tiny_verifier, bpe_draft, own_cache, which
):
    path = vocab_map_path(bpe_draft, tiny_verifier) if which == "vocabulary map" else counts_path(tiny_verifier)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    result = _run(cli, *_tiny(tiny_verifier, bpe_draft))
    if which == "vocabulary map":  # a damaged map: a warning, built again and kept
        assert f"specgguf: warning: {path}: a damaged vocabulary map (a FIFO" in result.stderr
        assert path.is_file() and np.load(path).dtype == np.int32
    else:  # not counted here: the overlap is told without the share of the verifier's answers
        assert path.is_fifo()


def _map_with_header(path: Path, shape: tuple[int, ...], dtype: str = "<i4", data: bytes = b"") -> None:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    with path.open("wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        handle.write(data)


def test_a_vocabulary_map_whose_header_claims_10_12_entries_is_rebuilt_naming_it(
    cli, tiny_verifier, bpe_draft, own_cache
):
    path = vocab_map_path(bpe_draft, tiny_verifier)
    path.parent.mkdir(parents=True)
    _map_with_header(path, (10**12,), data=b"\xff" * 64)  # it was a MemoryError traceback naming no file
    result = cli("run", *_tiny(tiny_verifier, bpe_draft), "the cat")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("specgguf: warning:")]
    assert warning.startswith(f"specgguf: warning: {path}: a damaged vocabulary map (expected int32 of shape (")
    assert "the header says int32 of shape (1000000000000,)" in warning and warning.endswith("building it again")
    assert np.load(path).shape != (10**12,)


@pytest.mark.parametrize(
    "shape, dtype, data, problem",
    [
        ((10**12,), "<i4", b"\x00" * 40, "the header says int32 of shape (1000000000000,)"),
        ((10,), "<i8", b"\x00" * 80, "the header says int64 of shape (10,)"),
        ((2, 5), "<i4", b"\x00" * 40, "the header says int32 of shape (2, 5)"),
        ((10,), "<i4", b"\x00" * 12, "its header says 10 entries, the file holds"),
        ((10,), "<i4", b"\x00" * 44, "its header says 10 entries, the file holds"),
    ],
)
def test_an_npy_header_is_checked_against_the_reader_and_the_file_size(tmp_path, shape, dtype, data, problem):
    from specgguf.files.small_files import read_npy

    path = tmp_path / "map.npy"
    _map_with_header(path, shape, dtype, data)
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        read_npy(path, dtype=np.int32, length=10)
    np.save(path, np.arange(10, dtype=np.int32))
    assert read_npy(path, dtype=np.int32, length=10).tolist() == list(range(10))


def test_an_npy_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    from specgguf.files.small_files import FileRefused, read_npy

    fifo = tmp_path / "map.npy"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused, match="a FIFO"):
        read_npy(fifo, dtype=np.int32, length=10)
    with pytest.raises(FileRefused, match="a device"):
        read_npy(Path("/dev/zero"), dtype=np.int32, length=10)


# --- stamps ---------------------------------------------------------------------------------
STAMP_IN_A_CHILD = """
import sys
from pathlib import Path
from specgguf.files.stamps import is_stamped, sha256_hex, stamped_sha256, write_stamp

source, stamp = Path(sys.argv[1]), Path(sys.argv[2])
digest = sha256_hex(source)
assert stamped_sha256(source, stamp=stamp) is None and not is_stamped(source, digest, stamp=stamp)
write_stamp(source, digest, stamp=stamp)
assert stamped_sha256(source, stamp=stamp) == digest and is_stamped(source, digest, stamp=stamp)
"""


def test_a_fifo_as_a_stamp_is_no_stamp_and_is_replaced_by_one(tmp_path):
    source, stamp = tmp_path / "model.gguf", tmp_path / "model.sha256"
    source.write_bytes(b"weights")
    os.mkfifo(stamp)  # reading it blocked (a stamp is read at every start), and so did writing one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", STAMP_IN_A_CHILD, source, stamp], env=env, check=True, timeout=60)
    assert stamp.is_file() and not stamp.is_fifo()
