"""Relays in front of and behind llama.cpp's RPC sockets: plain sockets and threads, no llama_cpp.

`WorkerRelay` is what a `specgguf worker` listens with: for each client it checks the
shared secret (with `--token`), then passes on only requests that `rpc_frames` admits to
ggml's RPC server on a private loopback port (`connect_inner`); the first request it
refuses closes that client's connection with one log line (a burst, then a line every
2 s at most and a count: `ThrottledLog`), and the worker goes on. ggml's answers come back unchanged. The handshake
(the token, or a token-less client's first byte) has one deadline in all, and connections
in their handshake have places of their own, the oldest ended when a new one needs its
place: peers that trickle a token a byte at a time cannot keep the token's holder out.

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

_MAX_CLIENTS = 32  # connections served at once (ggml serves one; the rest wait, or are being refused)
_MAX_WAITING = 32  # connections in their handshake; a new one past these ends the oldest
_TOKEN_WAIT = 10.0  # seconds a new client has for its whole handshake (its token, or HELLO's first byte)
_CHUNK = 1 << 20
_LOG_BURST, _LOG_EVERY = 10, 2.0  # refusals logged: this many at once, then one line per 2 s at most


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


class _Handshake:
    """Reads from a new client's socket against one deadline for the whole handshake: a peer that sends
    a byte every few seconds runs out of time as surely as a silent one (socket timeouts are per read)."""

    def __init__(self, client: socket.socket) -> None:
        self.client, self.deadline = client, time.monotonic() + _TOKEN_WAIT

    def _wait(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.client.settimeout(left)

    def peek(self) -> bytes:
        self._wait()
        return self.client.recv(1, socket.MSG_PEEK)

    def read(self, size: int, what: str) -> bytes:
        data = b""
        while len(data) < size:
            self._wait()
            chunk = self.client.recv(size - len(data))
            if not chunk:
                raise Refused(f"the connection ended inside {what} ({len(data)} of {size} bytes)")
            data += chunk
        return data


class ThrottledLog:
    """A burst of `_LOG_BURST` lines, then one line per `_LOG_EVERY` seconds at most; the lines held back
    are counted in the next one that is logged."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log, self._lock = log, threading.Lock()
        self._allowance, self._last, self._held_back = float(_LOG_BURST), time.monotonic(), 0

    def __call__(self, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            self._allowance = min(_LOG_BURST, self._allowance + (now - self._last) / _LOG_EVERY)
            self._last = now
            if self._allowance < 1:
                self._held_back += 1
                return
            self._allowance -= 1
            if self._held_back:
                self.log(f"... and {self._held_back} more refused or dropped connection(s), not logged")
                self._held_back = 0
            self.log(line)


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
        self.refusals = ThrottledLog(log)
        self.type_traits = type_traits  # ggml's block and type sizes: with them, tensors' data is checked
        self._token_digest = hashlib.sha256(token.encode()).digest() if token is not None else None
        self._lock = threading.Lock()
        self._serving = 0  # connections past their handshake
        self._waiting: dict[socket.socket, None] = {}  # in their handshake, oldest first
        self._ended: set[socket.socket] = set()  # ended by a newer connection while in their handshake
        self._turned_away = 0  # connections closed at once while all slots were taken, since the last log line
        self._last_turned_away_log = 0.0

    def serve_forever(self) -> None:
        while True:
            try:
                client, peer = self.listener.accept()
            except OSError:
                return  # closed
            if not self._wait_in_handshake(client):
                client.close()
                self._turned_away += 1
                if time.monotonic() - self._last_turned_away_log > 10:  # a flood is one line per 10 s
                    self.log(f"turned away {self._turned_away} connection(s): {_MAX_CLIENTS} already served")
                    self._turned_away, self._last_turned_away_log = 0, time.monotonic()
                continue
            threading.Thread(target=self._serve, args=(client, f"{peer[0]}:{peer[1]}"), daemon=True).start()

    def _wait_in_handshake(self, client: socket.socket) -> bool:
        """A place among the connections in their handshake (the oldest is ended when all are taken);
        False when every serving slot is taken."""
        with self._lock:
            if self._serving >= _MAX_CLIENTS:
                return False
            if len(self._waiting) >= _MAX_WAITING:
                oldest = next(iter(self._waiting))
                del self._waiting[oldest]
                self._ended.add(oldest)
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's read ends, and it leaves
            self._waiting[client] = None
            return True

    def _start_serving(self, client: socket.socket) -> None:
        with self._lock:
            if client not in self._waiting:
                raise Refused("ended while in its handshake")  # by a newer connection, just now
            del self._waiting[client]
            if self._serving >= _MAX_CLIENTS:
                raise Refused(f"{_MAX_CLIENTS} clients already served")
            self._serving += 1

    def _serve(self, client: socket.socket, peer: str) -> None:
        _nodelay(client)
        inner: socket.socket | None = None
        serving = False
        try:
            if not self._admit(client, _Handshake(client)):
                return
            self._start_serving(client)
            serving = True
            client.settimeout(None)
            stream = client.makefile("rb", buffering=_CHUNK)
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
            # The client is done sending: ggml finishes what it was sent, and its last answers go back
            # (unless they have already: the answers' thread then ended both connections itself).
            with contextlib.suppress(OSError):
                inner.shutdown(socket.SHUT_WR)
            passing.join()
        except (Refused, OSError) as error:
            self.refusals(self._why(client, peer, error))
        finally:
            with self._lock:
                self._waiting.pop(client, None)
                self._ended.discard(client)
                if serving:
                    self._serving -= 1
            for connection in (inner, client):
                if connection is not None:
                    with contextlib.suppress(OSError):
                        connection.shutdown(socket.SHUT_RDWR)
                    connection.close()

    def _why(self, client: socket.socket, peer: str, error: Exception) -> str:
        """The log line for a connection that ended in error."""
        with self._lock:
            if client in self._ended:
                return f"dropped {peer}: ended in its handshake to make room for a newer connection"
        if isinstance(error, TimeoutError):
            return f"refused {peer}: no handshake within {_TOKEN_WAIT:g} s of connecting"
        if isinstance(error, OSError):
            return f"dropped {peer}: {error.strerror or error}"
        return f"refused {peer}: {error}"

    def _admit(self, client: socket.socket, handshake: _Handshake) -> bool:
        """The token check; False for a client that left without a word (a port check)."""
        start = handshake.peek()
        if not start:
            return False
        if start != frames.TOKEN_MAGIC[:1]:
            if self._token_digest is not None:
                raise Refused("no token (this worker was started with --token)")
            return True
        if handshake.read(len(frames.TOKEN_MAGIC), "the token") != frames.TOKEN_MAGIC:
            raise Refused(f"unknown command {start[0]}")
        (length,) = struct.unpack("<H", handshake.read(2, "the token"))
        if length > frames.MAX_TOKEN_BYTES:
            raise Refused(f"a token of {length} bytes")
        given = hashlib.sha256(handshake.read(length, "the token")).digest()
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
