"""What the worker's relay adds to each RPC round trip: ggml's server straight vs. through the relay.

    python scripts/rpc_relay_latency.py --round-trips 2000 --set-tensor-kib 0 64 1024

Starts one `specgguf worker` (with a token, so the token tunnel is measured as well) and times,
on one connection each, GET_ALIGNMENT round trips (4 bytes out, 8 back) and SET_TENSOR + GET_TENSOR
pairs of the given sizes: sent to ggml's server behind the relay (its private port, found through
/proc), to the relay, and through the client's token tunnel to the relay. Linux only, one machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgguf.llama.rpc_frames import TOKEN_ACCEPTED, present_token  # noqa: E402
from specgguf.llama.rpc_relay import TokenTunnel  # noqa: E402

HELLO = struct.pack("<BQ", 14, 24) + bytes(24)
TOKEN = "latency-bench"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _recv(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return bytes(data)


def _answer(connection: socket.socket) -> bytes:
    (size,) = struct.unpack("<Q", _recv(connection, 8))
    return _recv(connection, size)


def _session(port: int, token: str | None) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if token is not None:
        assert present_token(connection, token) == TOKEN_ACCEPTED
    connection.sendall(HELLO)
    _answer(connection)
    return connection


def _tensor(buffer: int, data: int, n_bytes: int) -> bytes:
    n = max(1, n_bytes // 4)
    fields = (1, 0, buffer, n, 1, 1, 1, 4, 4 * n, 4 * n, 4 * n, 0, *[0] * 16, 0, *[0] * 10, 0, 0, data, b"t", 0)
    return struct.pack("<QIQ4I4II16ii10QQQQ64si", *fields)


def measure(port: int, token: str | None, round_trips: int, sizes_kib: list[int]) -> list[float]:
    """Microseconds per round trip: GET_ALIGNMENT, then a SET_TENSOR + GET_TENSOR pair per size."""
    connection = _session(port, token)
    timings = []
    request = struct.pack("<BQI", 1, 4, 0)
    started = time.perf_counter()
    for _ in range(round_trips):
        connection.sendall(request)
        _answer(connection)
    timings.append((time.perf_counter() - started) / round_trips * 1e6)
    for kib in sizes_kib:
        n_bytes = max(4, kib * 1024)
        connection.sendall(struct.pack("<BQIQ", 0, 12, 0, n_bytes))
        buffer, _ = struct.unpack("<QQ", _answer(connection))
        connection.sendall(struct.pack("<BQQ", 3, 8, buffer))
        (base,) = struct.unpack("<Q", _answer(connection))
        tensor, data = _tensor(buffer, base, n_bytes), bytes(n_bytes)
        set_tensor = struct.pack("<BQ", 6, len(tensor) + 9 + n_bytes) + tensor + struct.pack("<BQ", 0, 0) + data
        get_tensor = struct.pack("<BQ", 8, len(tensor) + 16) + tensor + struct.pack("<QQ", 0, n_bytes)
        count = max(1, round_trips // max(1, kib // 16))
        started = time.perf_counter()
        for _ in range(count):
            connection.sendall(set_tensor + get_tensor)
            _answer(connection)
        timings.append((time.perf_counter() - started) / count * 1e6)
    connection.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--set-tensor-kib", type=int, nargs="*", default=[0, 64, 1024])
    args = parser.parse_args()
    port = _free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "specgguf", "worker", "--port", str(port), "-t", "1"],
        env={**os.environ, "SPECGGUF_WORKER_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        inner = None
        deadline = time.monotonic() + 60
        while inner is None and time.monotonic() < deadline:
            time.sleep(0.2)
            children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
            for child in children:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                if b"specgguf.llama.rpc_child" in argv:
                    inner = int(argv[argv.index(b"specgguf.llama.rpc_child") + 1])
        time.sleep(2)  # the child listens
        assert inner is not None, "no ggml server child"
        tunnel = TokenTunnel("127.0.0.1", port, TOKEN, timeout=10)
        tunnel_port = int(tunnel.endpoint.rsplit(":", 1)[1])
        routes = {"ggml's server": (inner, None), "relay": (port, TOKEN), "tunnel + relay": (tunnel_port, None)}
        for route, token in routes.values():  # warm up every path first
            measure(route, token, max(1, args.round_trips // 10), args.set_tensor_kib)
        rows = {
            label: measure(route, token, args.round_trips, args.set_tensor_kib)
            for label, (route, token) in routes.items()
        }
    finally:
        worker.terminate()
        worker.wait()
    names = ["GET_ALIGNMENT"] + [f"SET+GET {kib} KiB" for kib in args.set_tensor_kib]
    straight = rows["ggml's server"]
    print(f"{'µs per round trip':<18}" + "".join(f"{name:>22}" for name in names))
    for label, timings in rows.items():
        cells = "".join(f"{t:>12.1f} ({t / s:>5.2f}x)" for t, s in zip(timings, straight, strict=True))
        print(f"{label:<18}{cells}")


if __name__ == "__main__":
    main()
