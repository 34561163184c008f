"""Relays in front of and behind llama.cpp's RPC sockets: plain sockets and threads, no llama_cpp.

`WorkerRelay` is what a `specgguf worker` listens with: for each client it checks the
shared secret (with `--token`), then passes on only requests that `rpc_frames` admits to
ggml's RPC server on a private loopback port (`connect_inner`); the first request it
refuses closes that client's connection with one log line, and the worker goes on.
ggml's answers come back unchanged.

`TokenTunnel` is the client side: ggml's RPC client connects by itself, to a HOST:PORT,
and knows no token, so it is pointed at a loopback port of this process that presents
the token to the worker and then pipes bytes both ways.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable

import numpy as np

from . import rpc_frames as frames
from .rpc_frames import Refused

_MAX_CLIENTS = 32  # connections open at once (ggml serves one; the rest wait, or are being refused)
_TOKEN_WAIT = 10.0  # seconds a new client has to start (its token, or HELLO)
_CHUNK = 1 << 20


def _nodelay(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy until either side ends, then end both."""
    with contextlib.suppress(OSError):
        while data := source.recv(_CHUNK):
            target.sendall(data)
    for connection in (source, target):
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)


def _read(stream, size: int, what: str) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise Refused(f"the connection ended inside {what} ({len(data)} of {size} bytes)")
    return data


class WorkerRelay:
    """Listens on the worker's public address; each client in a thread of its own."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        connect_inner: Callable[[], socket.socket],
        token: str | None,
        limit: int,
        log: Callable[[str], None],
        type_traits: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.listener, self.connect_inner, self.limit, self.log = listener, connect_inner, limit, log
        self.type_traits = type_traits  # ggml's block and type sizes: with them, tensors' data is checked
        self._token_digest = hashlib.sha256(token.encode()).digest() if token is not None else None
        self._slots = threading.BoundedSemaphore(_MAX_CLIENTS)
        self._turned_away = 0  # connections closed at once while all slots were taken, since the last log line
        self._last_turned_away_log = 0.0

    def serve_forever(self) -> None:
        while True:
            try:
                client, peer = self.listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                client.close()
                self._turned_away += 1
                if time.monotonic() - self._last_turned_away_log > 10:  # a flood is one line per 10 s
                    self.log(f"turned away {self._turned_away} connection(s): {_MAX_CLIENTS} already open")
                    self._turned_away, self._last_turned_away_log = 0, time.monotonic()
                continue
            threading.Thread(target=self._serve_in_slot, args=(client, f"{peer[0]}:{peer[1]}"), daemon=True).start()

    def _serve_in_slot(self, client: socket.socket, peer: str) -> None:
        try:
            self._serve(client, peer)
        finally:
            self._slots.release()

    def _serve(self, client: socket.socket, peer: str) -> None:
        _nodelay(client)
        stream = client.makefile("rb", buffering=_CHUNK)
        inner: socket.socket | None = None
        try:
            client.settimeout(_TOKEN_WAIT)
            if not self._admit(client, stream):
                return
            client.settimeout(None)
            inner = self.connect_inner()
            _nodelay(inner)
            buffers = frames.Buffers(*self.type_traits) if self.type_traits is not None else None
            answers: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
            passing = threading.Thread(target=_pass_answers, args=(inner, client, answers, buffers), daemon=True)
            passing.start()
            try:
                self._relay_requests(stream, inner, answers, buffers)
            finally:
                answers.put(None)
            # The client is done sending: ggml finishes what it was sent, and its last answers go back.
            inner.shutdown(socket.SHUT_WR)
            passing.join()
        except Refused as refused:
            self.log(f"refused {peer}: {refused}")
        except TimeoutError:
            self.log(f"refused {peer}: silent for {_TOKEN_WAIT:g} s after connecting")
        except OSError as error:
            self.log(f"dropped {peer}: {error.strerror or error}")
        finally:
            for connection in (inner, client):
                if connection is not None:
                    with contextlib.suppress(OSError):
                        connection.shutdown(socket.SHUT_RDWR)
                    connection.close()

    def _admit(self, client: socket.socket, stream) -> bool:
        """The token check; False for a client that left without a word (a port check)."""
        start = stream.peek(1)[:1]
        if not start:
            return False
        if start != frames.TOKEN_MAGIC[:1]:
            if self._token_digest is not None:
                raise Refused("no token (this worker was started with --token)")
            return True
        if _read(stream, len(frames.TOKEN_MAGIC), "the token") != frames.TOKEN_MAGIC:
            raise Refused(f"unknown command {start[0]}")
        (length,) = struct.unpack("<H", _read(stream, 2, "the token"))
        if length > frames.MAX_TOKEN_BYTES:
            raise Refused(f"a token of {length} bytes")
        given = hashlib.sha256(_read(stream, length, "the token")).digest()
        if self._token_digest is None:
            client.sendall(frames.TOKEN_MAGIC + bytes([frames.TOKEN_NOT_NEEDED]))
            raise Refused("a token, but this worker was started without --token")
        if not hmac.compare_digest(given, self._token_digest):
            client.sendall(frames.TOKEN_MAGIC + bytes([frames.TOKEN_REFUSED]))
            raise Refused("wrong token")
        client.sendall(frames.TOKEN_MAGIC + bytes([frames.TOKEN_ACCEPTED]))
        return True

    def _relay_requests(self, stream, inner: socket.socket, answers, buffers: frames.Buffers | None) -> None:
        first = True
        while header := stream.read(frames.HEADER.size):
            if len(header) != frames.HEADER.size:
                raise Refused(f"the connection ended inside a request header ({len(header)} of 9 bytes)")
            command, size = frames.HEADER.unpack(header)
            frames.check_header(command, size, first=first, limit=self.limit)
            first = False
            name = frames.COMMANDS[command][0]
            streamed = command == frames.SET_TENSOR and size > _CHUNK  # weights: passed on as they arrive
            payload = _read(stream, frames.TENSOR_SIZE if streamed else size, name)
            if command == frames.GRAPH_COMPUTE:
                tensors = frames.check_graph(payload)
                if buffers is not None:
                    buffers.check(tensors)
            elif buffers is not None:
                buffers.check_request(command, payload)
                if command == frames.FREE_BUFFER:
                    buffers.freed(payload)
            if command in frames.ANSWERED:
                answers.put((command, payload))
            inner.sendall(header + payload)
            size -= len(payload)
            while size:
                data = _read(stream, min(size, _CHUNK), name)
                inner.sendall(data)
                size -= len(data)


def _pass_answers(inner: socket.socket, client: socket.socket, answers, buffers: frames.Buffers | None) -> None:
    """ggml's answers, one per request that has one, to the client; the buffers they allocate and locate noted."""
    stream = inner.makefile("rb", buffering=_CHUNK)
    with contextlib.suppress(OSError, Refused):
        while (expected := answers.get()) is not None:
            command, request = expected
            (size,) = struct.unpack("<Q", _read(stream, 8, "an answer"))
            if size <= 16:
                answer = _read(stream, size, "an answer")
                if buffers is not None:
                    buffers.answered(command, request, answer)
                client.sendall(struct.pack("<Q", size) + answer)
                continue
            client.sendall(struct.pack("<Q", size))
            while size:
                data = _read(stream, min(size, _CHUNK), "an answer")
                client.sendall(data)
                size -= len(data)
    for connection in (inner, client):
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)


class TokenTunnel:
    """A loopback port of this process through which ggml's RPC client reaches `worker` with the token."""

    def __init__(self, host: str, port: int, token: str, *, timeout: float):
        self.target, self.token, self.timeout = (host, port), token, timeout
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="specgguf-rpc-tunnel", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(local,), daemon=True).start()

    def _connect(self, local: socket.socket) -> None:
        try:
            remote = socket.create_connection(self.target, timeout=self.timeout)
            if frames.present_token(remote, self.token) != frames.TOKEN_ACCEPTED:
                raise OSError("the worker refused the token")
            remote.settimeout(None)
        except OSError:
            local.close()  # ggml's client then fails, and the abort hook names the worker
            return
        _nodelay(local)
        _nodelay(remote)
        threading.Thread(target=_pipe, args=(remote, local), daemon=True).start()
        _pipe(local, remote)
