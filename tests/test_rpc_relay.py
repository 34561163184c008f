"""A hostile peer against a real `specgguf worker`: raw sockets, then a real client through `--rpc`.

Each packet here ends ggml's own RPC server (exit 0 on a 2^63 size, SIGSEGV on a graph
node of id 0, as `test_the_packets_are_real` shows on ggml's server behind the relay);
the worker's relay refuses them, logs one line, and the worker goes on serving.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgguf.llama import rpc_frames as frames
from specgguf.llama.rpc import RpcWorker, RpcWorkerError, probe
from specgguf.llama.rpc_relay import _LOG_BURST, _LOG_EVERY
from test_rpc import SPECGGUF, free_port

HELLO = struct.pack("<BQ", 14, 24) + bytes(24)
_HELLO_ANSWER = 8 + 28


class LoggedWorker:
    """A `specgguf worker` on 127.0.0.1 whose stderr (its log) goes to a file that tests read as it runs."""

    def __init__(self, log: Path, *extra: str, token: str | None = None):
        self.address = RpcWorker("127.0.0.1", free_port())
        self.log_path = log
        self.process = subprocess.Popen(
            [*SPECGGUF, "worker", "--port", str(self.address.port), "-t", "1", *extra],
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
            env={key: value for key, value in os.environ.items() if key != "SPECGGUF_WORKER_TOKEN"},
        )
        try:
            self.wait_serving(token)
        except BaseException:
            self.process.kill()
            raise

    def wait_serving(self, token: str | None = None) -> None:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(RpcWorkerError):
                probe(RpcWorker(self.address.host, self.address.port, token), timeout=2)
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker not serving: {self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_log(self, text: str, *, after: str = "") -> str:
        """The log once `text` is in what was logged after `after` (the log as it was before)."""
        deadline = time.monotonic() + 30
        while text not in self.log()[len(after) :]:
            assert time.monotonic() < deadline, f"{text!r} not in the log: {self.log()[len(after) :]}"
            time.sleep(0.05)
        return self.log()

    def child(self) -> tuple[int, int]:
        """ggml's server process behind the relay: (pid, its private port)."""
        for child in Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"specgguf.llama.rpc_child" in argv:
                return int(child), int(argv[argv.index(b"specgguf.llama.rpc_child") + 1])
        raise AssertionError("no ggml server child")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)


class LogRoom:
    """A lower bound on the module worker's room for refusal lines (ThrottledLog: a burst of `_LOG_BURST`,
    then one more per `_LOG_EVERY` seconds), from the lines it logged: each is counted as logged at the
    latest moment it can have been, the time it was read, so the room is never overestimated."""

    def __init__(self, worker: LoggedWorker) -> None:
        self.worker, self.room, self.read_at, self.n_lines = worker, float(_LOG_BURST), time.monotonic(), 0

    def wait_for(self, lines: float) -> None:
        """Until the worker has room for `lines` more refusal lines."""
        self._update()
        if self.room < lines:
            time.sleep((lines - self.room) * _LOG_EVERY)
            self._update()

    def _update(self) -> None:
        now = time.monotonic()
        logged = [line for line in self.worker.log().splitlines() if re.search(r": (refused|dropped) ", line)]
        self.room = min(float(_LOG_BURST), self.room + (now - self.read_at) / _LOG_EVERY)
        self.room -= len(logged) - self.n_lines
        self.read_at, self.n_lines = now, len(logged)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    worker = LoggedWorker(tmp_path_factory.mktemp("worker") / "worker.log")
    yield worker
    worker.stop()
    assert worker.process.returncode == 0


@pytest.fixture(scope="module")
def room(worker) -> LogRoom:
    return LogRoom(worker)


@pytest.fixture(autouse=True)
def log_room(request):
    """The tests before may have spent the module worker's burst of refusal lines: a test of it waits
    until it has room for the few lines it causes (every other test starts its own worker, or none)."""
    if "worker" in request.fixturenames:
        request.getfixturevalue("room").wait_for(3)


def graph(nodes: list[int], tensors: list[dict]) -> bytes:
    array = __import__("numpy").zeros(len(tensors), frames.TENSOR)
    for row, fields in zip(array, tensors, strict=True):
        for name, value in fields.items():
            row[name] = value
    body = struct.pack("<II", 0, len(nodes)) + struct.pack(f"<{len(nodes)}Q", *nodes)
    return body + struct.pack("<I", len(tensors)) + array.tobytes()


def request(command: int, payload: bytes, size: int | None = None) -> bytes:
    return struct.pack("<BQ", command, len(payload) if size is None else size) + payload


HOSTILE = {
    "size 2^63": (request(6, b"", size=1 << 63), "SET_TENSOR of 9223372036854775808 bytes"),
    "graph size 2^63": (request(10, b"", size=1 << 63), "GRAPH_COMPUTE of 9223372036854775808 bytes"),
    "node id 0": (request(10, graph([0], [])), "GRAPH_COMPUTE node 0 has id 0"),
    "node of no tensor": (request(10, graph([5], [{"id": 7}])), "node that is no tensor of the graph"),
    "source of no tensor": (request(10, graph([7], [{"id": 7, "src": [99] + [0] * 9}])), "whose source is no tensor"),
    "graph shorter than it says": (request(10, graph([7], [{"id": 7}])[:-8]), "does not hold 1 nodes and 1 tensors"),
    "unknown command": (request(18, b""), "unknown command 18"),
    "command 200": (request(200, b"x"), "unknown command 200"),
    "fixed size wrong": (request(15, b"abcd"), "DEVICE_COUNT of 4 bytes (it has 0)"),
    "HELLO twice": (HELLO, "HELLO twice"),
    "truncated request": (request(1, b"\0\0\0\0")[:11], "ended inside GET_ALIGNMENT (2 of 4 bytes)"),
    "truncated header": (b"\x01\x04\x00", "inside a request header (3 of 9 bytes)"),
}


def receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := connection.recv(size - len(data))):
        data += chunk
    return data


def send_after_hello(address: RpcWorker, data: bytes, *, hello: bool = True) -> bytes:
    """What the worker answers (until it closes) to HELLO and then `data`, sent and half-closed."""
    with socket.create_connection((address.host, address.port), timeout=10) as connection:
        if hello:
            connection.sendall(HELLO)
            assert len(receive(connection, _HELLO_ANSWER)) == _HELLO_ANSWER
        connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(1 << 16):
            answer += chunk
        return answer


def serves_a_real_client(cli, tiny_args, address: RpcWorker, env: dict | None = None) -> str:
    result = cli.process("run", *tiny_args, "--rpc", str(address), "the cat", timeout=120, env=env)
    assert result.returncode == 0 and result.stdout, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def tiny_args(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256", "--temp", "0", "-n", "4", "-t", "1", "-k", "2"]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_request_closes_that_connection_and_the_worker_serves_on(case, worker, cli, tiny_args):
    data, logged = HOSTILE[case]
    before = worker.log()
    assert send_after_hello(worker.address, data) == b""  # closed, nothing answered
    line = worker.wait_for_log(logged, after=before)[len(before) :].strip()
    assert line.startswith("specgguf worker: refused 127.0.0.1:") and "\n" not in line
    assert worker.process.poll() is None
    serves_a_real_client(cli, tiny_args, worker.address)
    assert "RPC server ended" not in worker.log()[len(before) :]  # ggml's server never went down


def test_a_deep_graph_is_computed_not_a_stack_overflow(worker):
    """A chain of 200,000 tensors (each the source of the next): ggml builds it by recursion, which
    overflowed the 8 MiB stack of its main thread (SIGSEGV); its server runs with a deeper one."""
    import numpy as np

    n = 200_000
    tensors = np.zeros(n, frames.TENSOR)
    tensors["id"] = np.arange(1, n + 1)
    tensors["src"][1:, 0] = np.arange(1, n)
    tensors["ne"], tensors["nb"] = 1, 4
    payload = struct.pack("<IIQI", 0, 1, n, n) + tensors.tobytes()
    before = worker.log()
    with socket.create_connection((worker.address.host, worker.address.port), timeout=60) as connection:
        connection.sendall(HELLO)
        assert len(receive(connection, _HELLO_ANSWER)) == _HELLO_ANSWER
        connection.sendall(request(10, payload) + request(15, b""))
        assert receive(connection, 12) == struct.pack("<QI", 4, 1)  # then DEVICE_COUNT was answered: one device
    assert "RPC server ended" not in worker.log()[len(before) :]


def test_a_flood_of_connections_is_turned_away_in_one_line(worker, cli, tiny_args):
    before = worker.log()
    held = [socket.create_connection((worker.address.host, worker.address.port), timeout=10) for _ in range(32)]
    try:
        for connection in held:
            connection.sendall(HELLO)  # past the handshake (a token-less worker's: a first byte), quiet when closed
        time.sleep(0.5)  # all 32 served: every slot taken
        for _ in range(20):
            with socket.create_connection((worker.address.host, worker.address.port), timeout=10) as extra:
                assert extra.recv(1) == b""  # closed at once
        assert worker.wait_for_log("turned away", after=before)[len(before) :].count("turned away") == 1
    finally:
        for connection in held:
            connection.close()
    serves_a_real_client(cli, tiny_args, worker.address)


def tensor(buffer: int, data: int, n_floats: int, *, type_: int = 0, nb0: int = 4) -> bytes:
    return graph([], [{"id": 1, "type": type_, "buffer": buffer, "data": data, "ne": [n_floats, 1, 1, 1],
                       "nb": [nb0, nb0 * n_floats, nb0 * n_floats, nb0 * n_floats]}])[12:]  # fmt: skip


def in_a_buffer(address: RpcWorker, hostile, *, ask_base: bool = True) -> bytes:
    """HELLO, a 64-byte buffer (and its base), then `hostile(buffer, base)`: what the worker answers to it."""
    with socket.create_connection((address.host, address.port), timeout=10) as connection:
        connection.sendall(HELLO)
        assert len(receive(connection, _HELLO_ANSWER)) == _HELLO_ANSWER
        connection.sendall(request(0, struct.pack("<IQ", 0, 64)))
        buffer, _ = struct.unpack("<8xQQ", receive(connection, 24))
        base = 0
        if ask_base:
            connection.sendall(request(3, struct.pack("<Q", buffer)))
            (base,) = struct.unpack("<8xQ", receive(connection, 16))
        connection.sendall(hostile(buffer, base))
        connection.shutdown(socket.SHUT_WR)
        return receive(connection, 1 << 20)


BUFFER_CASES = {
    "data past its buffer": (
        lambda buffer, base: request(8, tensor(buffer, base + 4096, 16) + struct.pack("<QQ", 0, 4)),
        "a tensor whose data is not inside its buffer",
    ),
    "one float too many": (
        lambda buffer, base: request(17, tensor(buffer, base, 17) + struct.pack("<QQB", 0, 4, 1)),
        "a tensor whose data is not inside its buffer",
    ),
    "data before its buffer": (
        lambda buffer, base: request(12, tensor(buffer, base - 8, 2)),
        "a tensor whose data is not inside its buffer",
    ),
    "a graph tensor past its buffer": (
        lambda buffer, base: request(10, graph([1], [{"id": 1, "buffer": buffer, "data": base + 64, "ne": [1] * 4}])),
        "a tensor whose data is not inside its buffer",
    ),
}


@pytest.mark.parametrize("case", BUFFER_CASES)
def test_a_tensor_outside_its_buffer_is_refused(case, worker, cli, tiny_args):
    hostile, logged = BUFFER_CASES[case]
    before = worker.log()
    assert in_a_buffer(worker.address, hostile) == b""
    assert logged in worker.wait_for_log(logged, after=before)[len(before) :]
    serves_a_real_client(cli, tiny_args, worker.address)
    assert "RPC server ended" not in worker.log()[len(before) :]


def test_a_buffer_never_given_is_none_to_ggml_too(worker):
    """ggml ignores a buffer it does not know (the tensor has none, and the request fails): it passes."""
    before = worker.log()
    read = lambda buffer, base: request(8, tensor(buffer + 64, base, 2) + struct.pack("<QQ", 0, 4))  # noqa: E731
    assert in_a_buffer(worker.address, read) == b""  # ggml closes the connection
    time.sleep(0.5)
    assert "refused" not in worker.log()[len(before) :] and "RPC server ended" not in worker.log()[len(before) :]
    worker.wait_serving()


def test_a_tensor_in_a_buffer_whose_base_was_not_asked_is_refused(worker):
    before = worker.log()
    read = lambda buffer, base: request(8, tensor(buffer, 1 << 40, 2) + struct.pack("<QQ", 0, 4))  # noqa: E731
    assert in_a_buffer(worker.address, read, ask_base=False) == b""
    assert "whose base this client did not ask for" in worker.wait_for_log("did not ask", after=before)[len(before) :]


def test_a_tensor_inside_its_buffer_is_served(worker):
    write = lambda buffer, base: (  # noqa: E731
        request(6, tensor(buffer, base, 16) + struct.pack("<BQ", 0, 0) + bytes(range(64)))
        + request(8, tensor(buffer, base, 16) + struct.pack("<QQ", 60, 4))
    )
    assert in_a_buffer(worker.address, write) == struct.pack("<Q", 4) + bytes([60, 61, 62, 63])


def test_the_first_request_must_be_hello(worker):
    before = worker.log()
    # Refusals are logged in a burst, then one line per 2 s (ThrottledLog): the tests before this one
    # may have spent the burst, so the refusal is sent again until a line of it is logged.
    deadline = time.monotonic() + 15
    while "the first request must be HELLO" not in worker.log()[len(before) :]:
        assert send_after_hello(worker.address, request(15, b""), hello=False) == b""
        assert time.monotonic() < deadline, worker.log()[len(before) :]
        time.sleep(0.5)


def test_the_packets_are_real_and_a_dead_ggml_server_is_started_again(worker, cli, tiny_args):
    """Sent past the relay, straight to ggml's server: the node-id-0 graph is a SIGSEGV, which the
    worker survives by starting ggml's server again; then a plain kill, the same."""
    before = worker.log()
    pid, port = worker.child()
    send_after_hello(RpcWorker("127.0.0.1", port), HOSTILE["node id 0"][0])
    worker.wait_for_log("ggml's RPC server ended (SIGSEGV); starting it again", after=before)
    worker.wait_serving()
    _, port = worker.child()
    in_a_buffer(RpcWorker("127.0.0.1", port), BUFFER_CASES["data past its buffer"][0])  # ggml asserts
    worker.wait_for_log("ggml's RPC server ended (SIGABRT); starting it again", after=before)
    worker.wait_serving()
    serves_a_real_client(cli, tiny_args, worker.address)
    new_pid, _ = worker.child()
    assert new_pid != pid
    os.kill(new_pid, signal.SIGKILL)
    worker.wait_for_log("ggml's RPC server ended (SIGKILL); starting it again", after=before)
    worker.wait_serving()
    serves_a_real_client(cli, tiny_args, worker.address)


SLOW_ANSWER = """
import socket, sys, time
with socket.create_server(("127.0.0.1", int(sys.argv[1]))) as server:
    while True:
        connection, _ = server.accept()
        if connection.recv(1):  # a request (the worker's own readiness check sends none)
            time.sleep(1.0)  # a graph that takes longer than connecting may
            connection.sendall(b"answer")
        connection.close()
"""


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_the_worker_waits_for_a_slow_answer_from_ggml(monkeypatch):
    """Connecting to ggml's server is bounded, its answers are not: a graph that computes for longer
    than the connect time-out (a long prompt on a slow worker) must not cut the client off."""
    from specgguf.cli import worker

    monkeypatch.setattr(worker, "_CONNECT_WAIT", 0.2)
    inner = worker.InnerServer(n_threads=1, cache_dir=None)
    inner._command = [sys.executable, "-c", SLOW_ANSWER, "PORT"]
    inner.start()
    try:
        with inner.connect() as connection:
            connection.sendall(b"?")
            assert connection.recv(16) == b"answer"
    finally:
        inner.stop()


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_ggml_server_that_cannot_start_stops_the_worker():
    from specgguf.cli.worker import InnerServer

    inner = InnerServer(n_threads=1, cache_dir=None)
    inner._command = [sys.executable, "-c", "raise SystemExit(3)", "PORT"]
    with pytest.raises(RpcWorkerError, match="ggml's RPC server could not be started"):
        inner.start()


# --- the shared secret -------------------------------------------------------------------
def test_only_holders_of_the_token_reach_ggml(tmp_path, cli, tiny_args):
    env = {"SPECGGUF_WORKER_TOKEN": "s3cret"}  # the client's; the worker's is its --token
    worker = LoggedWorker(tmp_path / "worker.log", "--token", "s3cret", token="s3cret")
    try:
        assert "token required" in worker.log()
        wrong = cli.process("run", *tiny_args, "--rpc", str(worker.address), "hi", env={"SPECGGUF_WORKER_TOKEN": "x"})
        assert wrong.error_line() == (
            f"specgguf: error: RPC worker {worker.address} refused the token: SPECGGUF_WORKER_TOKEN is not its --token"
        )
        assert "refused 127.0.0.1:" in worker.wait_for_log(": wrong token")
        none = cli.process("run", *tiny_args, "--rpc", str(worker.address), "hi", env={"SPECGGUF_WORKER_TOKEN": ""})
        assert "a worker started with --token needs SPECGGUF_WORKER_TOKEN here" in none.error_line()
        worker.wait_for_log("no token (this worker was started with --token)")
        # raw: HELLO without the token reaches nothing; a wrong token is answered "refused"
        assert send_after_hello(worker.address, b"", hello=False) == b""
        with socket.create_connection((worker.address.host, worker.address.port), timeout=10) as connection:
            assert frames.present_token(connection, "nope") == frames.TOKEN_REFUSED
            assert connection.recv(1) == b""
        assert worker.process.poll() is None
        assert serves_a_real_client(cli, tiny_args, worker.address, env=env)
        assert "RPC server ended" not in worker.log()
    finally:
        worker.stop()


def test_a_token_for_a_worker_without_one_is_an_error(worker, cli, tiny_args):
    result = cli.process("run", *tiny_args, "--rpc", str(worker.address), "hi", env={"SPECGGUF_WORKER_TOKEN": "x"})
    assert result.error_line() == (
        f"specgguf: error: RPC worker {worker.address} takes no token (started without --token):"
        " unset SPECGGUF_WORKER_TOKEN"
    )


def test_frames_rules():
    frames.check_header(14, 24, first=True, limit=100)
    frames.check_header(6, 305 + 100, first=False, limit=100)
    for command, size, first, words in (
        (6, 305 + 101, False, "at most this worker's memory"),
        (6, 304, False, "at least 305"),
        (13, 3259, False, "GET_ALLOC_SIZE of 3259 bytes (it has 3260)"),
        (14, 24, False, "HELLO twice"),
        (0, 12, True, "first request must be HELLO"),
    ):
        with pytest.raises(frames.Refused, match=re.escape(words)):
            frames.check_header(command, size, first=first, limit=100)
    frames.check_graph(graph([1, 2], [{"id": 1}, {"id": 2, "src": [1] + [0] * 9, "view_src": 1}]))
    with pytest.raises(frames.Refused, match="two tensors of one id"):
        frames.check_graph(graph([1], [{"id": 1}, {"id": 1}]))
    with pytest.raises(frames.Refused, match="of no node"):
        frames.check_graph(graph([], [{"id": 1}]))
    with pytest.raises(frames.Refused, match="whose source is no tensor"):
        frames.check_graph(graph([1], [{"id": 1, "view_src": 3}]))


def test_buffers_count_bytes_as_ggml_nbytes():
    """A Q4_0 tensor (blocks of 32 in 18 bytes) of 64 x 2 is 72 bytes: it fits a 72-byte buffer at its
    base, not one byte further, by either path (one request's tensor, a graph's tensors)."""
    import numpy as np

    buffers = frames.Buffers(np.array([1, 1, 32]), np.array([4, 2, 18]))
    buffers.answered(frames.ALLOC_BUFFER, struct.pack("<IQ", 0, 72), struct.pack("<QQ", 0xB0, 72))
    buffers.answered(frames.BUFFER_GET_BASE, struct.pack("<Q", 0xB0), struct.pack("<Q", 0x1000))

    def quantized(data: int) -> dict:
        return {"id": 1, "type": 2, "buffer": 0xB0, "data": data, "ne": [64, 2, 1, 1], "nb": [18, 36, 72, 72]}

    def both_paths(data: int) -> None:
        one = graph([1], [quantized(data)])
        buffers.check_request(12, one[20:])  # INIT_TENSOR: the tensor alone
        buffers.check(frames.check_graph(one))

    both_paths(0x1000)
    for data in (0x1001, 0xFFF):
        with pytest.raises(frames.Refused, match="not inside its buffer"):
            buffers.check_request(12, graph([1], [quantized(data)])[20:])
        with pytest.raises(frames.Refused, match="not inside its buffer"):
            buffers.check(frames.check_graph(graph([1], [quantized(data)])))
    buffers.freed(struct.pack("<Q", 0xB0))
    both_paths(0x9999)  # no longer its buffer: ggml ignores it
