"""Hardening, round two (issue 24): results are never lost (bench, tuning.json under concurrency and
full disks, chat /save), odd numbers and odd files are one line, and nothing hangs."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPECGGUF = [sys.executable, "-m", "specgguf"]


@pytest.fixture
def tiny(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256", "-n", "8"]


def small_files(limit: int):
    """`ulimit -f`: a disk that fills after `limit` bytes of any one file (Python ignores SIGXFSZ: EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


# --- temperatures ---------------------------------------------------------------------------
def test_a_subnormal_temperature_is_greedy(cli, tiny):
    from specgguf.core.sampling import SamplingSettings

    assert SamplingSettings(temperature=1e-320).greedy and SamplingSettings(temperature=1e-320).temperature == 0.0
    assert not SamplingSettings(temperature=0.01).greedy
    greedy = json.loads(cli("run", *tiny, "--temp", "0", "--json", "the cat").stdout)
    tiny_temp = cli("run", *tiny, "--temp", "1e-320", "--json", "the cat")
    assert tiny_temp.returncode == 0, tiny_temp.stderr
    assert json.loads(tiny_temp.stdout)["text"] == greedy["text"]
    chat = cli("chat", *tiny, "-q", stdin="/temp 1e-320\nthe cat\n")
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    assert greedy["text"].strip()[:10] in chat.stdout


# --- tuning.json ----------------------------------------------------------------------------
STORE_MANY = """
import sys
import time
from specgguf import tuning
for i in range(int(sys.argv[2])):
    tuning.store_seconds(f"{sys.argv[1]}-{i}", [0.001 * (i + 1), 0.002])
"""


def _store_at_once(count: int) -> list[tuple[int, bytes]]:
    """Two processes storing `count` entries each into tuning.json at once: their (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    writers = [
        subprocess.Popen([sys.executable, "-c", STORE_MANY, name, str(count)], env=env, stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]
    results = []
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        results.append((writer.returncode, stderr))
    return results


def test_two_processes_storing_at_once_keep_every_entry(config_home):
    for returncode, stderr in _store_at_once(150):
        assert returncode == 0, stderr
    from specgguf import tuning

    entries = json.loads(tuning.tuning_path().read_text())[tuning.machine_id()]
    assert len(entries) == 300
    assert not list(tuning.tuning_path().parent.glob("tmp*.tmp"))


def test_a_damaged_file_moved_aside_by_two_processes_at_once_fails_neither(config_home):
    from specgguf import tuning

    tuning.tuning_path().write_text("{damaged")
    for returncode, stderr in _store_at_once(3):
        assert returncode == 0 and b"Traceback" not in stderr, stderr
    assert len(json.loads(tuning.tuning_path().read_text())[tuning.machine_id()]) == 6
    assert tuning.tuning_path().with_name("tuning.json.damaged").read_text() == "{damaged"


def test_a_failed_tuning_write_leaves_no_temporary_file_and_the_old_file(config_home):
    from specgguf import tuning

    tuning.store_seconds("kept", [0.5, 0.6])
    before = tuning.tuning_path().read_text()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    writer = subprocess.run(
        [sys.executable, "-c", STORE_MANY, "big" * 50, "5"],
        env=env,
        capture_output=True,
        preexec_fn=small_files(len(before) + 10),
        timeout=120,
    )
    assert writer.returncode != 0 and b"File too large" in writer.stderr
    assert tuning.tuning_path().read_text() == before
    assert not list(tuning.tuning_path().parent.glob("tmp*.tmp"))


# --- bench prints first ---------------------------------------------------------------------
BENCH = ["bench", "--quick", "-k", "2", "--no-adaptive", "--prompts", "code"]


def test_bench_prints_its_results_when_the_config_folder_cannot_be_written(cli, tiny_verifier, tiny_draft, tmp_path):
    blocked = tmp_path / "config"
    blocked.mkdir()
    (blocked / "specgguf").write_text("a file where the folder should be")
    env = {"XDG_CONFIG_HOME": str(blocked)}
    result = cli(*BENCH, "-m", tiny_verifier, "-md", tiny_draft, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"][0]["best_k"]
    assert "specgguf: warning: could not store the results" in result.stderr and "Traceback" not in result.stderr
    table = cli(*BENCH, "-m", tiny_verifier, "-md", tiny_draft, env=env)
    assert table.returncode == 0 and "speedup" in table.stdout.lower(), table.stderr


def test_bench_prints_its_results_when_the_disk_fills(cli, tiny_verifier, tiny_draft, tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    command = [*BENCH, "-m", tiny_verifier, "-md", tiny_draft, "--json"]
    result = cli.process(*command, env=env, timeout=300, preexec_fn=small_files(64))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"][0]["best_k"]
    assert "could not store the results" in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "config" / "specgguf").glob("tmp*.tmp"))


def test_reading_back_what_bench_stored(cli, tiny_verifier, tiny_draft, config_home):
    result = cli(*BENCH, "-m", tiny_verifier, "-md", tiny_draft, "--json")
    assert result.returncode == 0, result.stderr
    from specgguf import tuning

    entries = json.loads(tuning.tuning_path().read_text())[tuning.machine_id()]
    # A busy machine (this suite's other workers) can leave every try of a tiny model's verify table
    # with a busy machine's shape: then it is not kept, and bench says so (tests/test_costs.py plants both).
    refused = "specgguf: warning: not keeping the verify costs" in result.stderr
    assert any(key.startswith("verify_costs|") for key in entries) != refused, result.stderr
    assert any(key.startswith("draft_costs|") for key in entries)
    assert entries[tuning.pair_key(Path(tiny_verifier), Path(tiny_draft))]["greedy"]["k"] in (
        0,
        2,
    )  # the K that was best


# --- chat /save -----------------------------------------------------------------------------
def test_save_to_a_bad_path_is_one_line_and_the_chat_goes_on(cli, tiny, tmp_path):
    questions = "/save a\x00b.md\n/save ~nosuchuser-specgguf/chat.md\n/save /proc/chat.md\nhello\n"
    result = cli("chat", *tiny, "--temp", "0", "-q", stdin=questions)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "cannot hold a NUL byte" in result.stderr and "no such user's home folder" in result.stderr
    assert result.stderr.count("could not save") == 3
    assert result.stdout.strip()  # the question after them was answered


def test_save_over_an_existing_file_on_a_full_disk_keeps_the_old_file(cli, tiny, tmp_path):
    transcript = tmp_path / "chat.md"
    transcript.write_text("the old transcript\n" * 200)
    before = transcript.read_text()
    result = cli.process(
        "chat",
        *tiny,
        "--temp",
        "0",
        "-q",
        stdin=f"hello\n/save {transcript}\n",
        preexec_fn=small_files(100),
        timeout=120,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "could not save" in result.stderr and "File too large" in result.stderr
    assert transcript.read_text() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chat.md"]  # no temporary file left


def test_save_keeps_an_existing_files_permissions(cli, tiny, tmp_path):
    transcript = tmp_path / "chat.json"
    transcript.write_text("{}")
    transcript.chmod(0o640)
    result = cli("chat", *tiny, "--temp", "0", "-q", stdin=f"hello\n/save {transcript}\n")
    assert result.returncode == 0, result.stderr
    assert json.loads(transcript.read_text())["turns"] and transcript.stat().st_mode & 0o777 == 0o640


# --- files that are not what they claim ------------------------------------------------------
@pytest.mark.parametrize("command", [["pairs"], ["run", "hi"], ["pull"]])
def test_a_models_yaml_that_is_not_utf8_names_the_file_and_the_offset(cli, config_home, command):
    registry = config_home / "specgguf" / "models.yaml"
    registry.write_bytes(b"pairs:\n  mine:\n    verifier: caf\xe9/x\n")
    line = cli(*command).error_line()
    assert str(registry) in line and "not UTF-8" in line and "byte 0xe9 at offset 32" in line


@pytest.mark.parametrize("host", ["a..b", ".gpu-box", "x" * 64 + ".example", "gpu-box.."])
def test_an_rpc_host_with_an_empty_or_over_long_label_is_one_line(cli, tiny, host):
    line = cli("run", *tiny, "--rpc", f"{host}:50052", "hi").error_line()
    assert "--rpc" in line and "not a valid host name" in line


# --- n-gram stores --------------------------------------------------------------------------
def _store(cli, tiny, tmp_path) -> tuple[list, dict, Path]:
    env = {"SPECGGUF_CACHE": str(tmp_path / "cache")}
    args = [*tiny, "--drafter", "ngram", "--keep-ngrams", "--temp", "0", "-q", "--raw"]
    assert cli("run", *args, "the cat was there and the cat was here", env=env).returncode == 0
    (saved,) = (tmp_path / "cache" / "ngrams").glob("*.npz")
    return args, env, saved


def test_an_ngram_store_with_ids_past_the_vocabulary_is_one_line_naming_it(cli, tiny, tmp_path):
    import numpy as np

    args, env, saved = _store(cli, tiny, tmp_path)
    with np.load(saved) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["follower_tokens"] = np.full_like(arrays["follower_tokens"], 1_000_000)
    with open(saved, "wb") as file:
        np.savez(file, **arrays)
    line = cli("run", *args, "the cat was", env=env).error_line()
    assert str(saved) in line and "past the model's vocabulary" in line and "llama_decode" not in line


def test_an_ngram_store_of_millions_of_entries_is_refused_at_once(cli, tiny, tmp_path):
    import numpy as np

    args, env, saved = _store(cli, tiny, tmp_path)
    n = 42_000_000  # a few MB on disk, GBs and a minute to read
    with np.load(saved) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays.update(
        ngram_lengths=np.full(n, 2, dtype=np.int8),
        ngram_tokens=np.zeros(2 * n, dtype=np.int32),
        n_followers=np.ones(n, dtype=np.int32),
        follower_tokens=np.zeros(n, dtype=np.int32),
        follower_counts=np.ones(n, dtype=np.int64),
    )
    with open(saved, "wb") as file:
        np.savez_compressed(file, **arrays)
    del arrays
    started = time.monotonic()
    line = cli("run", *args, "the cat was", env=env).error_line()
    assert time.monotonic() - started < 20
    assert str(saved) in line and "42000000 entries in ngram_lengths" in line


# --- run --raw parses special tokens, as llama.cpp's programs do -------------------------------
def test_raw_prompts_parse_special_tokens_unless_told_not_to(cli, tiny):
    prompt = "the cat</s><s>the dog"  # </s> and <s> are the tiny vocabulary's control tokens
    parsed = json.loads(cli("run", *tiny, "--temp", "0", "--raw", "--json", prompt).stdout)
    literal = json.loads(cli("run", *tiny, "--temp", "0", "--raw", "--no-special", "--json", prompt).stdout)
    plain = json.loads(cli("run", *tiny, "--temp", "0", "--raw", "--json", "the catthe dog").stdout)
    assert parsed["settings"]["special"] is True and literal["settings"]["special"] is False
    assert parsed["prompt_tokens"] == plain["prompt_tokens"] + 2  # each one token
    assert literal["prompt_tokens"] > parsed["prompt_tokens"]  # spelled out as text


# --- Ctrl-C ---------------------------------------------------------------------------------
@pytest.fixture
def ctrl_c_mid_answer(monkeypatch):
    """Each answer gets `n` Ctrl-Cs after its second step, back to back: as if llama.cpp computed a long
    step meanwhile (the signals then reach Python's handler as one call)."""
    from specgguf.cli import chat_session

    def arm(n: int) -> None:
        original = chat_session.Reply.__iter__

        def interrupted(reply):
            for index, event in enumerate(original(reply)):
                if index == 1:
                    for _ in range(n):
                        os.kill(os.getpid(), signal.SIGINT)
                yield event

        monkeypatch.setattr(chat_session.Reply, "__iter__", interrupted)

    yield arm
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the chat left it ignored


@pytest.mark.parametrize("n", [2, 3])
def test_ctrl_c_twice_during_a_chat_answer_leaves_with_130_and_no_traceback(cli, tiny, ctrl_c_mid_answer, n):
    ctrl_c_mid_answer(n)
    result = cli(
        "chat", *tiny, "-n", "200", "--temp", "1.5", "--seed", "3", "-q", stdin="tell me a story\nand another\n"
    )
    assert result.returncode == 130 and "Exception ignored" not in result.stderr
    assert result.error_line() == "specgguf: error: interrupted"
    assert result.stderr.count("(interrupted)") == 1  # the second question was never asked
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # while the models are freed


def test_ctrl_c_once_during_a_chat_answer_stops_only_that_answer(cli, tiny, ctrl_c_mid_answer):
    ctrl_c_mid_answer(1)
    result = cli(
        "chat", *tiny, "-n", "200", "--temp", "1.5", "--seed", "3", "-q", stdin="tell me a story\nand another\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("(interrupted)") == 2  # each answer stopped, the chat went on
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_once_our_package_is_imported_is_130_with_one_line():
    # The moment between `import specgguf` and main() taking over (python -m specgguf, the specgguf script).
    script = (
        "import sys, os, signal, time; sys.argv[0] = 'specgguf'; import specgguf;"
        " os.kill(os.getpid(), signal.SIGINT); time.sleep(10)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    assert result.returncode == 130 and result.stderr == b"specgguf: error: interrupted\n", result.stderr
    # Imported as a library (not the program), nothing is changed.
    library = "import signal, specgguf; assert signal.getsignal(signal.SIGINT) is signal.default_int_handler"
    assert (
        subprocess.run([sys.executable, "-c", library], env={**os.environ, "PYTHONPATH": os.getcwd()}).returncode == 0
    )


@pytest.mark.parametrize("delay", [0.05, 0.08, 0.12, 0.2, 0.4])
def test_sigint_soon_after_start_is_never_a_traceback_through_specgguf(delay):
    process = subprocess.Popen([*SPECGGUF, "pairs"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    stderr = err.decode()
    # (Python's own start-up, before any line of ours runs, is out of our hands: site, runpy.)
    assert "specgguf" not in stderr.split("Traceback", 1)[1] if "Traceback" in stderr else True, stderr
    if process.returncode not in (0,):  # it may have finished first
        assert process.returncode in (130, -signal.SIGINT), stderr
