"""What a well-formed llama.cpp RPC request is, as the vendored ggml-rpc.cpp (protocol v7) frames them.

ggml's RPC server trusts its peer: a size field of 2^63 makes it resize a buffer to that
size, a graph node whose id is 0 is a NULL it computes. `check_header` and `check_graph`
are the rules the worker's relay (rpc_relay.py) applies to every request before it
reaches ggml; `Refused` says which rule a request broke, in words for one log line.

Requests: | command (1 byte) | size (8 bytes, little-endian) | payload (size bytes) |. The
fixed-size commands have one exact size (ggml's packed structs, with rpc_tensor 296 bytes:
GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64); SET_TENSOR
carries its data after a 305-byte header, GRAPH_COMPUTE a graph.

The shared-secret preamble (a specgguf addition, before ggml's HELLO): the client sends
`TOKEN_MAGIC`, a 2-byte length and the token; the worker answers `TOKEN_MAGIC` and one
status byte (`TOKEN_ACCEPTED`, `TOKEN_REFUSED`, `TOKEN_NOT_NEEDED`) and closes unless accepted.
"""

from __future__ import annotations

import socket
import struct

import numpy as np

HELLO, SET_TENSOR, GRAPH_COMPUTE = 14, 6, 10
HEADER = struct.Struct("<BQ")
TENSOR_SIZE = 296
_MAX_SRC = 10
_SET_TENSOR_HEADER = TENSOR_SIZE + 1 + 8  # rpc_tensor, cache_flag, offset
GRAPH_LIMIT = 256 << 20  # a graph of ~900,000 tensors; llama.cpp's are a few thousand

# command -> (name, exact payload size or None when variable): RPC_CMD_* of the vendored ggml-rpc.cpp
COMMANDS: dict[int, tuple[str, int | None]] = {
    0: ("ALLOC_BUFFER", 4 + 8),
    1: ("GET_ALIGNMENT", 4),
    2: ("GET_MAX_SIZE", 4),
    3: ("BUFFER_GET_BASE", 8),
    4: ("FREE_BUFFER", 8),
    5: ("BUFFER_CLEAR", 8 + 1),
    SET_TENSOR: ("SET_TENSOR", None),
    7: ("SET_TENSOR_HASH", TENSOR_SIZE + 8 + 8),
    8: ("GET_TENSOR", TENSOR_SIZE + 8 + 8),
    9: ("COPY_TENSOR", 2 * TENSOR_SIZE),
    GRAPH_COMPUTE: ("GRAPH_COMPUTE", None),
    11: ("GET_DEVICE_MEMORY", 4),
    12: ("INIT_TENSOR", TENSOR_SIZE),
    13: ("GET_ALLOC_SIZE", 4 + TENSOR_SIZE * (1 + _MAX_SRC)),
    HELLO: ("HELLO", 24),
    15: ("DEVICE_COUNT", 0),
    16: ("GRAPH_RECOMPUTE", 4),
    17: ("MEMSET_TENSOR", TENSOR_SIZE + 8 + 8 + 1),
}

# struct rpc_tensor (packed)
TENSOR = np.dtype(
    [
        ("id", "<u8"),
        ("type", "<u4"),
        ("buffer", "<u8"),
        ("ne", "<u4", 4),
        ("nb", "<u4", 4),
        ("op", "<u4"),
        ("op_params", "<i4", 16),
        ("flags", "<i4"),
        ("src", "<u8", _MAX_SRC),
        ("view_src", "<u8"),
        ("view_offs", "<u8"),
        ("data", "<u8"),
        ("name", "S64"),
        ("use_count", "<i4"),
    ]
)
assert TENSOR.itemsize == TENSOR_SIZE

TOKEN_MAGIC = b"SPGGTOK1"
TOKEN_ACCEPTED, TOKEN_REFUSED, TOKEN_NOT_NEEDED = 1, 0, 2
MAX_TOKEN_BYTES = 1024


class Refused(Exception):
    """A request the worker does not pass on to ggml, and why (one line)."""


def check_header(command: int, size: int, *, first: bool, limit: int) -> None:
    """Refuse an unknown command, a size other than the command's, or data larger than `limit`."""
    if command not in COMMANDS:
        raise Refused(f"unknown command {command}")
    name, exact = COMMANDS[command]
    if first != (command == HELLO):
        raise Refused("the first request must be HELLO" if first else "HELLO twice")
    if exact is not None:
        if size != exact:
            raise Refused(f"{name} of {size} bytes (it has {exact})")
    elif command == SET_TENSOR:
        if not _SET_TENSOR_HEADER <= size <= _SET_TENSOR_HEADER + limit:
            raise Refused(f"SET_TENSOR of {size} bytes (at least {_SET_TENSOR_HEADER}, at most this worker's memory)")
    elif not 12 <= size <= min(limit, GRAPH_LIMIT):
        raise Refused(f"GRAPH_COMPUTE of {size} bytes")


def check_graph(payload: bytes) -> np.ndarray:
    """A graph ggml can build: | device u32 | n_nodes u32 | node ids u64[n_nodes] | n_tensors u32 |
    rpc_tensor[n_tensors] |, exactly that long, every node and every source or view a tensor of the message;
    its tensors."""
    _, n_nodes = struct.unpack_from("<II", payload)
    tensors_at = 8 + 8 * n_nodes + 4
    if len(payload) < tensors_at:
        raise Refused(f"GRAPH_COMPUTE of {len(payload)} bytes cannot hold {n_nodes} nodes")
    (n_tensors,) = struct.unpack_from("<I", payload, tensors_at - 4)
    if len(payload) != tensors_at + n_tensors * TENSOR_SIZE:
        raise Refused(f"GRAPH_COMPUTE of {len(payload)} bytes does not hold {n_nodes} nodes and {n_tensors} tensors")
    if n_nodes == 0:
        raise Refused("GRAPH_COMPUTE of no node")
    nodes = np.frombuffer(payload, "<u8", n_nodes, 8)
    tensors = np.frombuffer(payload, TENSOR, n_tensors, tensors_at)
    ids = np.sort(tensors["id"])
    if n_tensors and ids[0] == 0:
        raise Refused("GRAPH_COMPUTE with a tensor of id 0")
    if n_tensors > 1 and (ids[1:] == ids[:-1]).any():
        raise Refused("GRAPH_COMPUTE with two tensors of one id")
    zero = np.flatnonzero(nodes == 0)
    if zero.size:
        raise Refused(f"GRAPH_COMPUTE node {zero[0]} has id 0")
    if _unresolved(ids, nodes).size:
        raise Refused("GRAPH_COMPUTE node that is no tensor of the graph")
    sources = np.concatenate([tensors["src"].ravel(), tensors["view_src"]])
    if _unresolved(ids, sources[sources != 0]).size:
        raise Refused("GRAPH_COMPUTE tensor whose source is no tensor of the graph")
    return tensors


def _unresolved(sorted_ids: np.ndarray, refs: np.ndarray) -> np.ndarray:
    if not sorted_ids.size:
        return refs
    at = np.minimum(np.searchsorted(sorted_ids, refs), sorted_ids.size - 1)
    return refs[sorted_ids[at] != refs]


# --- the shared secret, before ggml's HELLO ---------------------------------------------------
def token_preamble(token: str) -> bytes:
    data = token.encode()
    return TOKEN_MAGIC + struct.pack("<H", len(data)) + data


def present_token(connection: socket.socket, token: str) -> int | None:
    """Send the token; the worker's status byte, or None if it answered no specgguf token status."""
    connection.sendall(token_preamble(token))
    answer = b""
    while len(answer) < len(TOKEN_MAGIC) + 1:
        chunk = connection.recv(len(TOKEN_MAGIC) + 1 - len(answer))
        if not chunk:
            break
        answer += chunk
    if len(answer) != len(TOKEN_MAGIC) + 1 or not answer.startswith(TOKEN_MAGIC):
        return None
    return answer[-1]


# --- tensors' data inside their buffers ------------------------------------------------------
# Where a request's tensors are: command -> offsets of its rpc_tensors (GET_ALLOC_SIZE: its
# sources only where their id is nonzero, as ggml reads them).
TENSORS_AT: dict[int, tuple[int, ...]] = {
    SET_TENSOR: (0,),
    7: (0,),
    8: (0,),
    9: (0, TENSOR_SIZE),
    12: (0,),
    13: tuple(4 + TENSOR_SIZE * i for i in range(1 + _MAX_SRC)),
    17: (0,),
}
ALLOC_BUFFER, BUFFER_GET_BASE, FREE_BUFFER = 0, 3, 4
_TENSOR_PLACE = struct.Struct("<8xIQ4I4I")  # rpc_tensor's type, buffer, ne, nb
_TENSOR_DATA = struct.Struct("<Q")  # rpc_tensor's data, at byte 220
ANSWERED = frozenset({HELLO, 15, ALLOC_BUFFER, 13, 1, 2, BUFFER_GET_BASE, 7, 8, 9, 11})  # commands ggml answers


class Buffers:
    """The buffers ggml allocated for one client (from its answers), to check every tensor's data
    lies inside its buffer before ggml sees it: ggml asserts so, which ends its server."""

    def __init__(self, block_sizes: np.ndarray, type_sizes: np.ndarray):
        self.block_sizes, self.type_sizes = block_sizes.astype(np.uint64), type_sizes.astype(np.uint64)
        self.sizes: dict[int, int] = {}  # remote_ptr -> size (ALLOC_BUFFER's answer)
        self.bases: dict[int, int] = {}  # remote_ptr -> base (BUFFER_GET_BASE's answer)

    def check(self, tensors: np.ndarray) -> None:
        """Refuse a tensor in one of this client's buffers whose base it never asked for, or whose data is not inside
        that buffer (as ggml_nbytes counts it: the span of its elements under its strides)."""
        placed = tensors[tensors["buffer"] != 0]
        placed = placed[placed["type"] < self.block_sizes.size]  # ggml refuses other types itself
        placed = placed[self.block_sizes[placed["type"]] != 0]
        if not placed.size:
            return
        types, blocks = placed["type"], self.block_sizes[placed["type"]]
        ne, nb = placed["ne"].astype(np.uint64), placed["nb"].astype(np.uint64)
        empty = (ne == 0).any(axis=1)
        spans = (np.maximum(ne, 1) - 1) * nb  # < 2^64: both factors are 32-bit
        first = np.where(blocks == 1, self.type_sizes[types] + spans[:, 0], ne[:, 0] * nb[:, 0] // blocks)
        if (first.astype(np.float64) + spans[:, 1:].astype(np.float64).sum(axis=1) >= 2.0**63).any():
            raise Refused("a tensor of 2^63 bytes or more")
        nbytes = np.where(empty, np.uint64(0), first + spans[:, 1:].sum(axis=1, dtype=np.uint64))
        for buffer in np.unique(placed["buffer"]).tolist():
            if buffer not in self.sizes:
                continue  # not (or no longer) this client's: ggml ignores it, as if none
            if buffer not in self.bases:
                raise Refused("a tensor in a buffer whose base this client did not ask for")
            mine = placed["buffer"] == buffer
            start = placed["data"][mine]
            end = start + nbytes[mine]
            base, size = self.bases[buffer], self.sizes[buffer]
            if (start < base).any() or (end < start).any() or (end > base + size).any():
                raise Refused("a tensor whose data is not inside its buffer")

    def check_request(self, command: int, payload: bytes) -> None:
        """The tensors of one request, in plain Python: a few microseconds (numpy's calls cost more)."""
        for at in TENSORS_AT.get(command, ()):
            if command == 13 and at > 4 and not struct.unpack_from("<Q", payload, at)[0]:
                continue  # GET_ALLOC_SIZE: ggml reads a source only where its id is nonzero
            type_, buffer, *shape = _TENSOR_PLACE.unpack_from(payload, at)
            if buffer:
                self._check_one(type_, buffer, shape[:4], shape[4:], _TENSOR_DATA.unpack_from(payload, at + 220)[0])

    def _check_one(self, type_: int, buffer: int, ne: list[int], nb: list[int], data: int) -> None:
        if type_ >= self.block_sizes.size or not (block := int(self.block_sizes[type_])):
            return  # ggml refuses it itself
        if 0 in ne:
            nbytes = 0
        elif block == 1:
            nbytes = int(self.type_sizes[type_]) + sum((n - 1) * stride for n, stride in zip(ne, nb, strict=True))
        else:
            nbytes = ne[0] * nb[0] // block + sum((n - 1) * stride for n, stride in zip(ne[1:], nb[1:], strict=True))
        if buffer not in self.sizes:
            return  # not (or no longer) this client's: ggml ignores it, as if none
        if buffer not in self.bases:
            raise Refused("a tensor in a buffer whose base this client did not ask for")
        base = self.bases[buffer]
        if not base <= data <= data + nbytes <= base + self.sizes[buffer] or data + nbytes >= 1 << 64:
            raise Refused("a tensor whose data is not inside its buffer")

    def answered(self, command: int, request: bytes, answer: bytes) -> None:
        if command == ALLOC_BUFFER and len(answer) == 16:
            pointer, size = struct.unpack("<QQ", answer)
            if pointer:
                self.sizes[pointer] = size
        elif command == BUFFER_GET_BASE and len(answer) == 8:
            (self.bases[struct.unpack("<Q", request)[0]],) = struct.unpack("<Q", answer)

    def freed(self, request: bytes) -> None:
        (pointer,) = struct.unpack("<Q", request)
        self.sizes.pop(pointer, None)
        self.bases.pop(pointer, None)
