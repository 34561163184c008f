"""Hardening, round three (issue 36), outside the server: one file cannot break the draft search or
`pairs --local` (crafted headers, nested JSON, FIFOs), the worker's handshake has one deadline, signals
end in one line, and draft variants are written safely. Each case: one `specgguf: error:` line or a
one-line warning and a skip, a non-zero exit where it fails, nothing written outside its root."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import time
from pathlib import Path

import pytest

from fake_stores import add_lmstudio_model, add_ollama_model, write_manifest
from tiny_gguf import write_tiny_llama

ARRAY, STRING, UINT32, FLOAT32 = 9, 8, 4, 6


def _text(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(data)) + data


def raw_gguf(path: Path, entries: list[bytes], *, n_keys: int | None = None, size: int | None = None) -> Path:
    """A GGUF header written byte by byte (version 3, no tensors), `size` bytes long if given (sparse)."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries) if n_keys is None else n_keys)
    path.write_bytes(header + b"".join(entries))
    if size is not None:
        os.truncate(path, size)  # a hole: the bytes are zeros, and nothing is on disk
    return path


def key_string(key: str, value: str) -> bytes:
    return _text(key) + struct.pack("<I", STRING) + _text(value)


def key_array(key: str, kind: int, count: int, items: bytes = b"") -> bytes:
    return _text(key) + struct.pack("<IIQ", ARRAY, kind, count) + items


VOCAB = [key_string("general.architecture", "llama"), key_string("tokenizer.ggml.model", "llama")]
TOKENS = key_array("tokenizer.ggml.tokens", STRING, 3, b"".join(_text(t) for t in ("<unk>", "<s>", "</s>")))
HOSTILE_HEADERS = {
    "scores claiming 2^62 floats": ([*VOCAB, TOKENS, key_array("tokenizer.ggml.scores", FLOAT32, 1 << 62)], {}),
    "10^8 empty tokens in a sparse file": (
        [*VOCAB, key_array("tokenizer.ggml.tokens", STRING, 10**8)],
        {"size": 8 * 10**8 + 4096},
    ),
    "10^8 merges in a sparse file": (
        [*VOCAB, TOKENS, key_array("tokenizer.ggml.merges", STRING, 10**8)],
        {"size": 8 * 10**8 + 4096},
    ),
    "2^60 keys": ([*VOCAB], {"n_keys": 1 << 60}),
    "a key of 2^63 bytes": ([struct.pack("<Q", 1 << 63)], {}),
    "a string of 2^64 - 1 bytes": ([_text("general.name") + struct.pack("<IQ", STRING, (1 << 64) - 1)], {}),
    "an array of arrays": ([key_array("tokenizer.ggml.tokens", ARRAY, 2)], {}),
    "4 * 10^7 zeroed keys": ([], {"n_keys": 4 * 10**7, "size": 13 * 4 * 10**7 + 4096}),
}


@pytest.mark.parametrize("case", HOSTILE_HEADERS)
def test_a_header_is_refused_by_what_its_file_can_hold_before_anything_is_read(tmp_path, case):
    from specgguf.files.gguf_header import HeaderError, read_metadata

    entries, shape = HOSTILE_HEADERS[case]
    path = raw_gguf(tmp_path / "hostile.gguf", entries, **shape)
    started = time.monotonic()
    with pytest.raises(HeaderError, match="malformed|cut short"):
        read_metadata(path)
    assert time.monotonic() - started < 10  # 10^8 claimed entries are refused, not walked


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile-three-ggufs")
    return {
        "big": write_tiny_llama(folder / "big.gguf", base_seed=7, n_embd=128, n_layer=4),
        "small": write_tiny_llama(folder / "small.gguf", base_seed=7, n_embd=32, n_layer=1, n_head=2),
    }


@pytest.fixture
def stores(tmp_path, monkeypatch) -> tuple[Path, Path]:
    ollama, lmstudio = tmp_path / "ollama" / "models", tmp_path / "lmstudio" / "models"
    ollama.mkdir(parents=True)
    lmstudio.mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("SPECGGUF_LMSTUDIO_MODELS", str(lmstudio))
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return ollama, lmstudio


def _hostile_models_in(stores: tuple[Path, Path], tmp_path: Path) -> None:
    """A 2^62-float scores array in the Ollama store; 10^8 tokens in a sparse file in LM Studio's folder."""
    ollama, lmstudio = stores
    entries, _ = HOSTILE_HEADERS["scores claiming 2^62 floats"]
    add_ollama_model(ollama, "evil", "scores", raw_gguf(tmp_path / "scores.gguf", entries))
    entries, shape = HOSTILE_HEADERS["10^8 empty tokens in a sparse file"]
    (lmstudio / "evil" / "sparse").mkdir(parents=True)
    raw_gguf(lmstudio / "evil" / "sparse" / "tokens.gguf", entries, **shape)


def test_the_draft_search_skips_a_hostile_header_with_one_warning_each(cli, ggufs, stores, tmp_path):
    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    _hostile_models_in(stores, tmp_path)
    started = time.monotonic()
    result = cli("run", "-m", "ollama:tiny:big", "-n", "4", "--temp", "0", "--json", "the cat")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["settings"]["model_draft"] == str(draft)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("specgguf: warning: skipped")]
    assert len(warnings) == 2, result.stderr
    assert any("ollama:evil:scores" in line and "tokenizer.ggml.scores" in line for line in warnings)
    assert any("lmstudio:evil/sparse/tokens.gguf" in line and "tokenizer.ggml.tokens" in line for line in warnings)
    assert time.monotonic() - started < 60


def test_pairs_local_lists_the_good_pair_past_hostile_headers(cli, ggufs, stores, tmp_path):
    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    _hostile_models_in(stores, tmp_path)
    result = cli("pairs", "--local", "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (pair,) = json.loads(result.stdout)
    assert (pair["verifier"], pair["draft"]) == ("ollama:tiny:big", "lmstudio:pub/Tiny-GGUF/small.gguf")
    assert result.stderr.count("specgguf: warning: skipped") == 2, result.stderr


# --- JSON files: nesting, FIFOs, devices, damaged entries -----------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000


def test_a_deeply_nested_ollama_manifest_is_one_line_and_skipped_in_the_search(cli, ggufs, stores):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    write_manifest(ollama, "deep", "x", []).write_bytes(b'{"layers": ' + DEEP + b"}")
    line = cli("run", "-m", "ollama:deep:x", "the cat").error_line()
    assert "manifest of ollama:deep:x" in line and "nested too deeply" in line
    listed = cli("pairs", "--local", "--json")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr


def test_a_fifo_as_an_ollama_manifest_is_refused_without_waiting(cli, stores):
    ollama, _ = stores
    manifest = write_manifest(ollama, "fifo", "x", [])
    manifest.unlink()
    os.mkfifo(manifest)
    line = cli("run", "-m", "ollama:fifo:x", "the cat").error_line()
    assert "is a FIFO" in line
    assert cli("pairs", "--local", "--json").returncode == 0


@pytest.mark.parametrize("settings", ["deep", "fifo", "dev-zero"])
def test_lmstudio_settings_that_cannot_be_read_are_a_warning_and_the_default_folder(
    tmp_path, monkeypatch, capsys, settings
):
    from specgguf.files import lmstudio

    monkeypatch.delenv("SPECGGUF_LMSTUDIO_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".lmstudio").mkdir()
    path = tmp_path / ".lmstudio" / "settings.json"
    if settings == "deep":
        path.write_bytes(b'{"downloadsFolder": ' + DEEP + b"}")
    elif settings == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    assert lmstudio.store_root() == tmp_path / ".lmstudio" / "models"
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("specgguf: warning: ") and "settings.json" in line and "default folder" in line


def _summary_entry(path: Path) -> tuple[str, dict]:
    from dataclasses import asdict

    from specgguf.files.gguf_header import summarize

    resolved, stat = path.resolve(), path.stat()
    return f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}", asdict(summarize(resolved))


def test_a_damaged_vocab_index_entry_is_read_again_from_the_file(cli, ggufs, stores):
    from specgguf.files.gguf_header import index_path

    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    key, entry = _summary_entry(draft)
    index_path().parent.mkdir(parents=True, exist_ok=True)
    index_path().write_text(json.dumps({"version": 1, "files": {key: {**entry, "size": "12"}, "x\0|1|2": entry}}))
    result = cli("run", "-m", "ollama:tiny:big", "-n", "4", "--temp", "0", "--json", "the cat")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["settings"]["model_draft"] == str(draft)
    saved = json.loads(index_path().read_text())["files"]
    assert saved[key]["size"] == draft.stat().st_size and "x\0|1|2" not in saved


@pytest.mark.parametrize("index", ["deep", "fifo", "dev-zero"])
def test_a_vocab_index_that_cannot_be_read_is_rebuilt(cli, ggufs, stores, index):
    from specgguf.files.gguf_header import index_path

    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    index_path().parent.mkdir(parents=True, exist_ok=True)
    if index == "deep":
        index_path().write_bytes(b'{"version": 1, "files": ' + DEEP + b"}")
    elif index == "fifo":
        os.mkfifo(index_path())
    else:
        index_path().symlink_to("/dev/zero")
    result = cli("pairs", "--local", "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert len(json.loads(result.stdout)) == 1
    assert len(json.loads(index_path().read_text())["files"]) == 2  # replaced by a good one


@pytest.mark.parametrize("schema", ["deep", "fifo", "dev-zero"])
def test_a_json_schema_file_that_cannot_be_read_is_one_line(cli, tiny_verifier, tmp_path, schema):
    path = tmp_path / "schema.json"
    if schema == "deep":
        path.write_bytes(b'{"type": "array", "items": ' + DEEP + b"}")
    elif schema == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    line = cli("run", "-m", tiny_verifier, "--json-schema", path, "the cat").error_line()
    assert (
        "--json-schema" in line and {"deep": "nested too deeply", "fifo": "FIFO", "dev-zero": "device"}[schema] in line
    )
    if schema != "deep":
        assert "--grammar" in cli("run", "-m", tiny_verifier, "--grammar", path, "the cat").error_line()


# --- the worker: one deadline for the handshake, its own places, a throttled log ------------
@pytest.mark.live  # LoggedWorker (test_rpc_relay.py) starts `specgguf worker`
def test_peers_trickling_a_token_cannot_keep_its_holder_out(tmp_path, cli, tiny_verifier, tiny_draft):
    import socket
    import threading

    from specgguf.llama import rpc_frames as frames
    from specgguf.llama.rpc_relay import _LOG_BURST, _LOG_EVERY
    from test_rpc_relay import _HELLO_ANSWER, HELLO, LoggedWorker, receive, serves_a_real_client

    worker = LoggedWorker(tmp_path / "worker.log", "--token", "s3cret", token="s3cret")
    address = (worker.address.host, worker.address.port)
    stop = threading.Event()
    try:
        before = worker.log()
        tricklers = [socket.create_connection(address, timeout=30) for _ in range(32)]
        started = time.monotonic()

        def trickle() -> None:  # one byte of a long token a second from each, for as long as it is open
            for byte in frames.TOKEN_MAGIC + struct.pack("<H", 1024) + b"a" * 1024:
                for connection in tricklers:
                    with contextlib.suppress(OSError):
                        connection.send(bytes([byte]))
                if stop.wait(1.0):
                    return

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.5)  # every place taken
        with socket.create_connection(address, timeout=10) as holder:
            assert frames.present_token(holder, "s3cret") == frames.TOKEN_ACCEPTED
            holder.sendall(HELLO)
            assert len(receive(holder, _HELLO_ANSWER)) == _HELLO_ANSWER
        args = ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256", "--temp", "0", "-n", "4", "-t", "1", "-k", "2"]
        serves_a_real_client(cli, args, worker.address, env={"SPECGGUF_WORKER_TOKEN": "s3cret"})
        for connection in tricklers:  # each ended by the handshake's deadline, though it kept sending
            assert connection.recv(1) == b""
        assert time.monotonic() - started < 25
        logged = worker.wait_for_log("no handshake within 10 s of connecting", after=before)[len(before) :]
        lines = [line for line in logged.splitlines() if "refused" in line or "dropped" in line]
        most = _LOG_BURST + (time.monotonic() - started) / _LOG_EVERY  # a burst, then a line every 2 s at most
        assert 1 <= len(lines) <= most < 32, logged
        assert worker.process.poll() is None
    finally:
        stop.set()
        worker.stop()


def test_the_refusal_log_is_a_burst_then_a_line_now_and_then_with_a_count(monkeypatch):
    from specgguf.llama import rpc_relay

    monkeypatch.setattr(rpc_relay, "_LOG_EVERY", 0.2)
    lines: list[str] = []
    log = rpc_relay.ThrottledLog(lines.append)
    for i in range(50):
        log(f"refused peer {i}")
    assert lines == [f"refused peer {i}" for i in range(rpc_relay._LOG_BURST)]
    time.sleep(0.3)
    log("refused one more")
    held_back = 50 - rpc_relay._LOG_BURST
    assert lines[-2:] == [f"... and {held_back} more refused or dropped connection(s), not logged", "refused one more"]


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_worker_token_in_the_environment_is_an_error(cli, value):
    from test_rpc import free_port

    result = cli.process("worker", "--port", str(free_port()), env={"SPECGGUF_WORKER_TOKEN": value}, timeout=60)
    line = result.error_line()  # (in a process: a worker that starts serves until it is stopped)
    assert "SPECGGUF_WORKER_TOKEN" in line and ("empty" in line or "only spaces" in line)


# --- signals: Ctrl-C at any import, a model file cut short under a running process ----------
INTERRUPT_AT_IMPORT = """
import os
import sys


class InterruptAtImport:  # Ctrl-C just as the module named in $INTERRUPT_AT_IMPORT starts to import
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == os.environ["INTERRUPT_AT_IMPORT"]:
            sys.meta_path.remove(InterruptAtImport)
            os.kill(os.getpid(), 2)
        return None


sys.meta_path.insert(0, InterruptAtImport)
"""


@pytest.mark.parametrize(
    "module", ["signal", "specgguf.__main__", "numpy", "typer", "platform", "specgguf.cli.app", "llama_cpp"]
)
def test_ctrl_c_at_any_import_is_one_line_and_130(cli, tiny_verifier, tmp_path, module):
    """A sitecustomize module sends the SIGINT at a chosen import, instead of a timer that may miss it
    (`signal`: specgguf/__init__.py imported it before its handler was in place, a traceback; `platform`,
    under Typer, is where a timer's signal once landed in CI, inside a class body: see the wrapped case in
    test_hostile_hub_and_files)."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AT_IMPORT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {"INTERRUPT_AT_IMPORT": module, "PYTHONPATH": path}
    result = cli.process("run", "-m", tiny_verifier, "-n", "4", "the cat", env=env, timeout=120)
    assert (result.returncode, result.stderr) == (130, "specgguf: error: interrupted\n")


# What pip writes for [project.scripts] (`specgguf = "specgguf.__main__:main"`), run under any name.
CONSOLE_SCRIPT = """import sys
from specgguf.__main__ import main
if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.mark.parametrize("module", ["signal", "enum"])  # (later imports: the tests above)
@pytest.mark.parametrize("name", ["specgguf.exe", "sg"])  # (`specgguf` itself: test_results_never_lost)
def test_ctrl_c_at_an_import_under_the_console_script_is_one_line_whatever_its_name(
    tiny_verifier, tmp_path, module, name
):
    """The console script imports specgguf.__main__, whose `import signal` came before any handler where
    the program's name was not exactly `specgguf` (Windows' specgguf.exe, a symlink): a traceback."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AT_IMPORT)
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / name
    script.write_text(CONSOLE_SCRIPT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "INTERRUPT_AT_IMPORT": module, "PYTHONPATH": path}
    command = [sys.executable, script, "run", "-m", tiny_verifier, "-n", "4", "the cat"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (130, "specgguf: error: interrupted\n")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("module", ["signal", "typer", "specgguf.cli.app", "llama_cpp"])
def test_ctrl_c_at_an_import_is_130_even_where_the_parent_left_sigint_ignored(cli, tiny_verifier, tmp_path, module):
    """A job a script put in the background starts with SIGINT ignored (so did this suite in CI): a
    Ctrl-C or `kill -INT` still stops it with one line (it was ignored until the imports were done)."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AT_IMPORT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {"INTERRUPT_AT_IMPORT": module, "PYTHONPATH": path}
    result = cli.process(
        "run", "-m", tiny_verifier, "-n", "4", "the cat", env=env, timeout=120, preexec_fn=_ignore_sigint
    )
    assert (result.returncode, result.stderr) == (130, "specgguf: error: interrupted\n")


def test_a_model_file_cut_short_under_a_running_chat_is_one_line(tiny_verifier, tmp_path):
    import shutil
    import subprocess
    import sys

    model = shutil.copyfile(tiny_verifier, tmp_path / "verifier.gguf")
    chat = subprocess.Popen(
        [sys.executable, "-m", "specgguf", "chat", "-m", model, "-md", model, "-c", "256", "-n", "8", "-t", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SPECGGUF_HUGE_PAGES": "0"},  # mapped: with huge pages the weights are read in
    )
    assert chat.stdin is not None and chat.stdout is not None
    chat.stdin.write(b"the cat\n")
    chat.stdin.flush()
    assert chat.stdout.readline()  # the first answer: the weights are mapped and in use
    os.truncate(model, 0)  # cut short under it: the next page read is a SIGBUS
    _, stderr = chat.communicate(b"the dog\n", timeout=120)
    lines = stderr.decode().strip().splitlines()
    assert chat.returncode == 1 and "Traceback" not in stderr.decode(), stderr
    assert lines[-1].startswith("specgguf: error: a model file changed while this process was reading it")
