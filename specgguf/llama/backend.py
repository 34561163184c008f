"""llama.cpp through llama-cpp-python's low-level API. The only module that imports llama_cpp.

`LlamaModel` implements the engine's `Model` protocol: it owns one model, one
context and one batch, asks llama.cpp for logits only at the positions the
loop needs (never `logits_all`), and rolls the KV cache back with
`llama_memory_seq_rm`. Pinned to llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TypeVar, cast

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_types import ChatCompletionRequestMessage

from ..errors import ContextFullError, DecodeError, ModelLoadError, PromptError, debug_enabled
from .compat import VocabInfo
from .ggml_devices import Ggml
from .rpc import DEFAULT_TIMEOUT, Placement, RpcWorker, Watchdog, probe
from .threads import ThreadGovernor

if TYPE_CHECKING:
    from _typeshed import TraceFunction

# --- logging: llama.cpp's messages go to a ring buffer, shown on failure or on request ---
_LOG_ERROR = 3
_recent_log: deque[str] = deque(maxlen=40)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if level == _LOG_ERROR:
        _recent_log.append(message.strip())
    if debug_enabled():
        os.write(2, text)


# --- Ctrl-C while llama.cpp loads: Python drops a KeyboardInterrupt raised inside a C callback
# ("Exception ignored ..."), so while loading, Ctrl-C only sets a flag, the progress callback
# asks llama.cpp to stop, and the interrupt is raised once llama.cpp has returned.
_interrupted = threading.Event()


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C during the block stops it and raises KeyboardInterrupt afterwards, never lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _interrupted.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _interrupted.is_set():
        raise KeyboardInterrupt


def _load_model(
    path: Path, params: llama_cpp.llama_model_params, *, on_progress: Callable[[], None] | None = None
) -> ctypes.c_void_p | None:
    """llama.cpp's load, abandoned at once on Ctrl-C; `on_progress` is called as it goes."""

    def progress(_progress: float, _user_data: ctypes.c_void_p) -> bool:
        if on_progress is not None:
            on_progress()
        return not _interrupted.is_set()  # False: llama.cpp abandons the load

    callback = llama_cpp.llama_progress_callback(progress)  # referenced until the load returns
    params.progress_callback = callback
    with _interruptible():
        return llama_cpp.llama_model_load_from_file(str(path).encode(), params)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


_governor: ThreadGovernor | None = None


def _shared_governor() -> ThreadGovernor:
    """One for the process: both models follow the same reading of the load."""
    global _governor
    if _governor is None:
        _governor = ThreadGovernor()
    return _governor


def _reason(default: str) -> str:
    """The last error llama.cpp logged, for a one-line message."""
    errors = [line for line in _recent_log if line]
    return errors[-1] if errors else default


def check_gguf_file(path: Path) -> None:
    """Fail with a clear message before llama.cpp sees a file that cannot be a GGUF."""
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: not a file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")


# --- RPC: layers on other machines' `specgguf worker` (or llama.cpp rpc-server) ---
RPC_INSTALL = (
    "this llama-cpp-python was built without llama.cpp's RPC backend; reinstall it with RPC:"
    " CMAKE_ARGS='-DGGML_RPC=ON' pip install --no-cache-dir --force-reinstall"
    " llama-cpp-python==0.3.36 (what `make install` does)"
)
_ggml: Ggml | None = None
_watchdog: Watchdog | None = None  # set once RPC devices are registered in this process


def _ggml_library() -> Ggml:
    global _ggml
    if _ggml is None:
        _ggml = Ggml(Path(llama_cpp.__file__).parent / "lib")
    return _ggml


def _require_rpc() -> Ggml:
    ggml = _ggml_library()
    if not llama_cpp.llama_supports_rpc() or not ggml.has_rpc():
        raise ModelLoadError(RPC_INSTALL)
    return ggml


def _rpc_devices(workers: Sequence[RpcWorker], timeout: float) -> list[int]:
    """Check each worker's handshake ourselves (ggml-rpc would abort), then register its devices."""
    global _watchdog
    ggml = _require_rpc()
    for worker in workers:
        # Not once this process holds a connection to it: a worker serves one client at a time.
        if _watchdog is None or worker not in _watchdog.workers:
            probe(worker, timeout=min(timeout, 10.0))
    if _watchdog is None:
        _watchdog = watchdog = Watchdog(workers, timeout=timeout)
        # From here on a failing worker makes ggml abort(): say which one, in one line.
        ggml.on_abort(
            lambda message: watchdog.fail(f"llama.cpp's RPC client failed ({message.rsplit(': ', 1)[-1].strip()})")
        )
    else:
        _watchdog.workers = tuple(dict.fromkeys(_watchdog.workers + tuple(workers)))
    devices = []
    for worker in workers:
        with _watchdog.guard(f"while connecting to {worker}"):
            found = ggml.add_rpc_server(str(worker))
        if not found:
            raise ModelLoadError(f"RPC worker {worker} offers no device")
        devices.extend(found)
    return devices


def _device_list(devices: list[int]) -> ctypes.Array:
    """A NULL-terminated ggml_backend_dev_t array, for llama_model_params.devices."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def rpc_server_devices() -> list[tuple[int, str]]:
    return _require_rpc().server_devices()


def start_rpc_server(endpoint: str, *, cache_dir: str | None, n_threads: int, devices: list[int]) -> None:
    """ggml's RPC server on this machine's devices: blocks (in C) for as long as it serves."""
    _require_rpc().start_rpc_server(endpoint, cache_dir=cache_dir, n_threads=n_threads, devices=devices)


MAX_TREE_LEAVES = 16  # sequences per context: the most leaves a draft tree may have


@dataclass
class _PendingTree:
    """A tree evaluated but not yet kept: where it starts, its shape, each node's sequence."""

    base: int
    tokens: list[int]
    parents: list[int]
    sequence: list[int]

    @property
    def chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))


class LlamaModel:
    """One GGUF model with its own context: the engine's `Model`.

    With `rpc_workers`, its layers go to those workers (all of them unless
    `n_gpu_layers` says how many; the rest stay here); without, once RPC devices
    exist in this process, the model is pinned to this machine's devices.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        rpc_workers: Sequence[RpcWorker] = (),
        rpc_timeout: float = DEFAULT_TIMEOUT,
    ):
        self.path = Path(path)
        check_gguf_file(self.path)
        model_params = llama_cpp.llama_model_default_params()
        self._devices = None
        if rpc_workers:
            self._devices = _device_list(_rpc_devices(rpc_workers, rpc_timeout))
            n_gpu_layers = n_gpu_layers or -1  # RPC devices count as GPUs: by default, every layer
        elif _watchdog is not None:
            self._devices = _device_list(_ggml_library().local_offload_devices())
        if self._devices is not None:
            model_params.devices = ctypes.addressof(self._devices)
        model_params.n_gpu_layers = n_gpu_layers
        remote = _watchdog if rpc_workers else None
        self._guard = remote.guard if remote else lambda _during: contextlib.nullcontext()
        # Loading sends the weights to the workers: time out on silence, not on size.
        feed = (lambda: remote.feed("while loading")) if remote else None
        _recent_log.clear()
        with self._guard(f"while loading {self.path.name}"):
            self._model = _load_model(self.path, model_params, on_progress=feed)
        if not self._model:
            raise ModelLoadError(f"{self.path}: llama.cpp could not load it: {_reason('unknown error')}")
        # llama.cpp offloads the last n_gpu_layers of (the repeating layers, then the output layer).
        n_layers = llama_cpp.llama_model_n_layer(self._model)
        offloaded = n_layers if n_gpu_layers < 0 else max(0, min(n_gpu_layers - 1, n_layers))
        self.placement = Placement(
            workers=tuple(map(str, rpc_workers)), n_layers=n_layers, n_layers_remote=offloaded if rpc_workers else 0
        )
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = n_ctx
        context_params.n_batch = context_params.n_ubatch = n_batch
        # Draft trees: one sequence per leaf, all in one KV cache (the context's cells are shared).
        context_params.n_seq_max = MAX_TREE_LEAVES
        context_params.kv_unified = True
        # No -t: the thread count follows the machine's load (cores.py), checked as we decode.
        self._governor = _shared_governor() if n_threads is None else None
        threads = n_threads if n_threads is not None else _shared_governor().threads
        context_params.n_threads = context_params.n_threads_batch = threads
        self.n_threads, self.n_gpu_layers = threads, n_gpu_layers  # what its speed depends on
        with self._guard(f"while creating {self.path.name}'s context"), _interruptible():
            self._ctx = llama_cpp.llama_init_from_model(self._model, context_params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise ModelLoadError(f"{self.path}: could not create a context: {_reason('out of memory?')}")
        # llama.cpp may round the context up and caps the batch at it: use what it
        # really has, but never more context than the user asked for.
        self.n_ctx = min(n_ctx, llama_cpp.llama_n_ctx(self._ctx))
        self.n_batch = min(n_batch, llama_cpp.llama_n_batch(self._ctx), llama_cpp.llama_n_ubatch(self._ctx))
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, MAX_TREE_LEAVES)
        self._tree: _PendingTree | None = None
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.cached: list[int] = []  # the tokens in the KV cache
        self.busy_seconds = 0.0  # time spent inside llama.cpp evaluating (for overhead figures)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            with self._guard("while freeing the model"):
                llama_cpp.llama_batch_free(self._batch)
                llama_cpp.llama_free(self._ctx)
                llama_cpp.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        self.close()

    # --- the engine's protocol ---
    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Append tokens to the cache in chunks of n_batch; logits only for the last n_logits."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context overflow: {self.n_past} + {len(tokens)} tokens > {self.n_ctx}")
        if n_logits > min(len(tokens), self.n_batch):
            raise ValueError(f"asked for {n_logits} logits rows from {len(tokens)} tokens")
        if self._governor is not None:
            self._follow_load(self._governor)
        started = time.perf_counter()
        batch = self._batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            first_output = len(tokens) - n_logits - start  # index in this chunk
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i >= first_output
            batch.n_tokens = len(chunk)
            self._decode(batch)
            self.cached.extend(chunk)
        return self._logits(n_logits, started)

    def _decode(self, batch: llama_cpp.llama_batch) -> None:
        with self._guard("while decoding"):
            status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            raise DecodeError(f"{self.path.name}: llama_decode failed ({status}): {_reason('')}")

    def _logits(self, n_logits: int, started: float) -> np.ndarray:
        """The last decode's n_logits rows; the time since `started` counts as busy."""
        if n_logits == 0:
            logits = np.empty((0, self.n_vocab), dtype=np.float32)
        else:
            with self._guard("while decoding"):
                pointer = llama_cpp.llama_get_logits(self._ctx)
                logits = np.ctypeslib.as_array(pointer, shape=(n_logits, self.n_vocab)).copy()
        self.busy_seconds += time.perf_counter() - started
        return logits

    def _follow_load(self, governor: ThreadGovernor) -> None:
        governor.check()
        if governor.threads != self.n_threads:
            if debug_enabled():
                os.write(
                    2,
                    f"specgguf: {self.path.name}: {self.n_threads} -> {governor.threads} threads"
                    " (the machine's load changed)\n".encode(),
                )
            self.n_threads = governor.threads
            llama_cpp.llama_set_n_threads(self._ctx, self.n_threads, self.n_threads)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Evaluate a tree after the cache in one batch (see the engine's `Model`). A chain is `eval`.

        Each leaf's path is one llama.cpp sequence: a token belongs to the sequences of the leaves
        below it, and sequence s first shares the cached context (`seq_cp` of sequence 0), so every
        token attends to the context and its own ancestors only."""
        chain = list(parents) == list(range(-1, len(tokens) - 1))
        base = self.n_past
        if chain:
            self._tree = _PendingTree(base, list(tokens), list(parents), [0] * len(tokens))
            return self.eval(tokens, n_logits=n_logits)
        if base + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context overflow: {base} + {len(tokens)} tokens > {self.n_ctx}")
        if len(tokens) > self.n_batch or not 0 < n_logits <= len(tokens):
            raise ValueError(f"a tree of {len(tokens)} tokens with {n_logits} logits rows does not fit a batch")
        has_child = set(parents)
        leaves = [node for node in range(len(tokens)) if node not in has_child]
        if len(leaves) > MAX_TREE_LEAVES:
            raise ValueError(f"a tree with {len(leaves)} leaves; at most {MAX_TREE_LEAVES}")
        sequences: list[list[int]] = [[] for _ in tokens]
        for sequence, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                sequences[node].append(sequence)
                node = parents[node]
        depth: list[int] = []
        for parent in parents:
            depth.append(depth[parent] + 1 if parent >= 0 else 0)
        if self._governor is not None:
            self._follow_load(self._governor)
        started = time.perf_counter()
        batch = self._batch
        with self._guard("while decoding"):
            for sequence in range(1, len(leaves)):
                llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
                llama_cpp.llama_memory_seq_cp(self._memory, 0, sequence, -1, -1)
        first_output = len(tokens) - n_logits
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = base + depth[i]
            batch.n_seq_id[i] = len(sequences[i])
            for j, sequence in enumerate(sorted(sequences[i])):
                batch.seq_id[i][j] = sequence
            batch.logits[i] = i >= first_output
        batch.n_tokens = len(tokens)
        self._decode(batch)
        self._tree = _PendingTree(base, list(tokens), list(parents), [min(s) for s in sequences])
        return self._logits(n_logits, started)

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep the pending tree's `path` (root to node) in the cache as sequence 0, drop the rest."""
        tree, self._tree = self._tree, None
        if tree is None:
            raise ValueError("keep_path without a pending tree")
        if any(tree.parents[node] != (path[i - 1] if i else -1) for i, node in enumerate(path)):
            raise ValueError(f"{list(path)} is not a path from the root of the tree")
        if tree.chain:
            self.rewind(tree.base + len(path))
            return
        # The last node's sequence holds the context and exactly this path up to it.
        sequence = tree.sequence[path[-1]] if path else 0
        with self._guard("while rolling back the cache"):
            llama_cpp.llama_memory_seq_keep(self._memory, sequence)
            llama_cpp.llama_memory_seq_rm(self._memory, sequence, tree.base + len(path), -1)
            if sequence != 0:
                llama_cpp.llama_memory_seq_cp(self._memory, sequence, 0, -1, -1)
                llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
        self.cached.extend(tree.tokens[node] for node in path)

    def rewind(self, n_past: int) -> None:
        self._tree = None
        if n_past < self.n_past:
            with self._guard("while rolling back the cache"):
                # Every sequence: a tree's other branches go too.
                llama_cpp.llama_memory_seq_rm(self._memory, -1, n_past, -1)
            del self.cached[n_past:]

    def clear(self) -> None:
        """Empty the whole KV cache, whatever it holds (e.g. after a call was interrupted)."""
        with self._guard("while clearing the cache"):
            llama_cpp.llama_memory_clear(self._memory, True)
        self.cached.clear()
        self._tree = None

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # --- text ---
    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Text -> tokens, adding BOS if the model wants it and parsing special tokens."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, True, special)
        if count < 0:
            buffer = (llama_cpp.llama_token * -count)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, -count, True, special)
        tokens = list(buffer[:count])
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]  # a template that writes BOS itself, plus add_bos
        return tokens

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for; control tokens (EOS, <|im_end|>) give b''."""
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, False)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, False)
        return buffer.raw[:size]

    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        """Render messages with the GGUF's own chat template, ready for the assistant's turn."""
        template = self.chat_template()
        if template is None:
            raise PromptError(f"{self.path.name} has no chat template; use --raw to send the text as is")

        def render() -> str:
            formatter = Jinja2ChatFormatter(
                template=template, eos_token=self._piece_text("eos"), bos_token=self._piece_text("bos")
            )
            # llama-cpp-python types each role's message apart; these are plain role/content dicts.
            return formatter(messages=cast("list[ChatCompletionRequestMessage]", messages)).prompt

        # The template is code from the file: it may fail, or loop for ever. Neither may escape as
        # a traceback or a hang.
        try:
            return within_time(render, seconds=TEMPLATE_SECONDS)
        except TimeoutError:
            raise PromptError(
                f"{self.path.name}'s chat template did not finish within {TEMPLATE_SECONDS:g} s;"
                " use --raw to send the text as is"
            ) from None
        except Exception as error:  # noqa: BLE001 - any failure of the file's own code
            detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            raise PromptError(
                f"{self.path.name}'s chat template failed ({detail}); use --raw to send the text as is"
            ) from None

    def _piece_text(self, which: str) -> str:
        token = getattr(llama_cpp, f"llama_vocab_{which}")(self._vocab)
        return "" if token < 0 else llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", "replace")

    # --- what the compatibility check reads ---
    def vocab_info(self) -> VocabInfo:
        return _vocab_info(self._vocab, self.path.name)


T = TypeVar("T")
TEMPLATE_SECONDS = 5.0  # a real chat template renders in milliseconds


def within_time(work: Callable[[], T], *, seconds: float) -> T:
    """work(), stopped with TimeoutError if it runs past `seconds` (Python code only: a line tracer
    in this thread checks the clock, so it stops loops in a Jinja template, which compiles to Python)."""
    deadline, ticks = time.monotonic() + seconds, 0
    previous = sys.gettrace()

    def tracer(frame: FrameType, event: str, arg: object) -> TraceFunction:
        nonlocal ticks
        ticks += 1
        if ticks % 256 == 0 and time.monotonic() > deadline:
            raise TimeoutError
        return tracer

    sys.settrace(tracer)
    try:
        return work()
    finally:
        sys.settrace(previous)


def _vocab_info(vocab: llama_cpp.llama_vocab_p, name: str) -> VocabInfo:
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    return VocabInfo(
        name=name,
        vocab_type=llama_cpp.llama_vocab_type(vocab),
        n_vocab=n_vocab,
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        bos=llama_cpp.llama_vocab_bos(vocab),
        eos=llama_cpp.llama_vocab_eos(vocab),
        token_texts=tuple(llama_cpp.llama_vocab_get_text(vocab, token) for token in range(n_vocab)),
    )


def read_vocab(path: str | Path, *, metadata_keys: Sequence[str] = ()) -> tuple[VocabInfo, dict[str, str]]:
    """A GGUF's vocabulary and some metadata values, loading no weights (for `check` and `pull`)."""
    path = Path(path)
    check_gguf_file(path)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    _recent_log.clear()
    model = _load_model(path, params)
    if not model:
        raise ModelLoadError(f"{path}: llama.cpp could not read its vocabulary: {_reason('unknown error')}")
    try:
        metadata = {}
        for key in metadata_keys:
            buffer = ctypes.create_string_buffer(256)
            size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
            if size >= len(buffer):  # chat templates are long: ask again with room for all of it
                buffer = ctypes.create_string_buffer(size + 1)
                size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
            if size >= 0:
                metadata[key] = buffer.value.decode("utf-8", "replace")
        return _vocab_info(llama_cpp.llama_model_get_vocab(model), path.name), metadata
    finally:
        llama_cpp.llama_model_free(model)


def convert_to_f16(source: Path, destination: Path, *, n_threads: int | None = None) -> Path:
    """Re-quantize a GGUF to F16 (e.g. to get a memory-bound verifier for benchmarks)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = n_threads or (os.cpu_count() or 1)
    partial = destination.with_name(destination.name + ".incomplete")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if status != 0:
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"could not convert {source} to F16: {_reason(str(status))}")
    os.replace(partial, destination)
    return destination
