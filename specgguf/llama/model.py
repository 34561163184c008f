"""`LlamaModel`: one GGUF model with its own context, the engine's `Model` through llama-cpp-python's
low-level API. It asks llama.cpp for logits only at the positions the loop needs (never
`logits_all`) and rolls the KV cache back with `llama_memory_seq_rm`. Pinned to llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

from ..errors import Cancelled, ContextFullError, DecodeError, ModelLoadError, PromptError, debug_enabled
from . import huge_pages, rpc_devices, stops, vocab
from .batcher import WAIT_SECONDS
from .compat import VocabInfo
from .embedding import Embedder
from .info import FimTokens, ModelInfo, fim_tokens, model_info
from .rpc import DEFAULT_TIMEOUT, Placement, RpcWorker
from .runtime import (
    ABORTED,
    check_gguf_file,
    decode,
    interruptible,
    load_model,
    reason,
    recent_log,
    shared_governor,
)
from .state import load_sequence, save_sequence
from .tree import MAX_TREE_LEAVES, TreeLayout

if TYPE_CHECKING:
    from .batcher import SequenceView


_CONTROL_TOKENS_READ = threading.Lock()  # LlamaModel.control_tokens: one reader at a time


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
            self._devices = rpc_devices.register_workers(rpc_workers, rpc_timeout)
            n_gpu_layers = n_gpu_layers or -1  # RPC devices count as GPUs: by default, every layer
        elif rpc_devices.watchdog() is not None:
            self._devices = rpc_devices.local_devices()
        if self._devices is not None:
            model_params.devices = ctypes.addressof(self._devices)
        model_params.n_gpu_layers = n_gpu_layers
        if huge_pages.read_into_memory(self.path, local=self._devices is None and n_gpu_layers == 0):
            model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE  # every weight in huge pages, none mapped
        remote = rpc_devices.watchdog() if rpc_workers else None
        self._guard = remote.guard if remote else lambda _during: contextlib.nullcontext()
        # Loading sends the weights to the workers: time out on silence, not on size.
        feed = (lambda: remote.feed("while loading")) if remote else None
        recent_log.clear()
        with self._guard(f"while loading {self.path.name}"):
            self._model = load_model(self.path, model_params, on_progress=feed)
        if not self._model:
            raise ModelLoadError(f"{self.path}: llama.cpp could not load it: {reason('unknown error')}")
        # llama.cpp offloads the last n_gpu_layers of (the repeating layers, then the output layer).
        n_layers = llama_cpp.llama_model_n_layer(self._model)
        offloaded = n_layers if n_gpu_layers < 0 else max(0, min(n_gpu_layers - 1, n_layers))
        self.placement = Placement(
            workers=tuple(map(str, rpc_workers)), n_layers=n_layers, n_layers_remote=offloaded if rpc_workers else 0
        )
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self._model)
        # No -t: the thread count follows the machine's load (threads.py), checked as we decode.
        self._governor = shared_governor() if n_threads is None else None
        threads = n_threads if n_threads is not None else shared_governor().threads
        self.n_threads, self.n_gpu_layers = threads, n_gpu_layers  # what its speed depends on
        self._ctx: llama_cpp.llama_context_p | None = self._new_context(n_ctx=n_ctx, n_batch=n_batch, n_threads=threads)
        # llama.cpp may round the context up and caps the batch at it: use what it
        # really has, but never more context than the user asked for.
        self.n_ctx = min(n_ctx, llama_cpp.llama_n_ctx(self._ctx))
        self.n_batch = min(n_batch, llama_cpp.llama_n_batch(self._ctx), llama_cpp.llama_n_ubatch(self._ctx))
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, MAX_TREE_LEAVES)  # what a decode fills
        self._embd_batch: Any = None  # for eval_embeddings, made on first use
        self._tree: TreeLayout | None = None
        self.max_leaves = MAX_TREE_LEAVES  # one sequence per leaf: the most leaves `eval_tree` takes
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.cached: list[int] = []  # the tokens in the KV cache
        self.n_seq = 1  # sequences in the context (`sequences`: serve --parallel)
        self._decoders: list[Any] = []  # sequences.LlamaDecoder, freed with the context
        self.busy_seconds = 0.0  # time spent inside llama.cpp evaluating (for overhead figures)

    def _new_context(self, *, n_ctx: int, n_batch: int, n_threads: int, n_seq: int = 1) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        # Draft trees: one sequence per leaf, all in one KV cache (the context's cells are shared).
        # Several requests (`sequences`): a cache of its own per sequence, no trees (sequences.py).
        params.n_seq_max = MAX_TREE_LEAVES if n_seq == 1 else n_seq
        params.kv_unified = n_seq == 1
        params.n_threads = params.n_threads_batch = n_threads
        with self._guard(f"while creating {self.path.name}'s context"), interruptible():
            context = llama_cpp.llama_init_from_model(self._model, params)
        if not context:
            llama_cpp.llama_model_free(self._model)
            raise ModelLoadError(f"{self.path}: could not create a context: {reason('out of memory?')}")
        return context

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def sequences(
        self, n_seq: int, *, wait_seconds: float = WAIT_SECONDS, calibrate: bool = False
    ) -> list[SequenceView]:
        """Make the context hold `n_seq` sequences of `n_ctx` tokens each (serve --parallel) and return
        a view per sequence, each the engine's `Model` (batcher.py). The context is made anew, empty;
        from then on only the views evaluate (draft trees are off: `max_leaves` is 1). `calibrate`:
        what a pass costs is measured now (sequences.LlamaDecoder.calibrate)."""
        from .sequences import LlamaDecoder, sequence_views

        with self._guard("while freeing the context"):
            llama_cpp.llama_free(self._ctx)
        self._ctx = None
        self._ctx = self._new_context(
            n_ctx=self.n_ctx * n_seq, n_batch=self.n_batch, n_threads=self.n_threads, n_seq=n_seq
        )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_seq, self.max_leaves, self.cached, self._tree = n_seq, 1, [], None
        self.n_ctx = min(self.n_ctx, llama_cpp.llama_n_ctx_seq(self._ctx))
        self._decoders.append(decoder := LlamaDecoder(self))  # freed with the context
        return sequence_views(self, decoder, wait_seconds, calibrate=calibrate)

    def kv_bytes_per_sequence(self) -> int:
        """What one more sequence of `n_ctx` tokens costs: keys and values of every layer, F16."""
        from .sequences import kv_bytes_per_token

        return kv_bytes_per_token(self._model) * self.n_ctx

    def follow_load(self) -> None:
        """Set the thread count by the machine's load (without -t), before a decode."""
        if (governor := self._governor) is None:
            return
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

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            with self._guard("while freeing the model"):
                if getattr(self, "_embedder", None) is not None:
                    self._embedder.close()  # its context before the weights it reads
                for decoder in self._decoders:
                    decoder.close()
                llama_cpp.llama_batch_free(self.batch)
                if self._embd_batch is not None:
                    llama_cpp.llama_batch_free(self._embd_batch)
                llama_cpp.llama_free(self._ctx)
                llama_cpp.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        self.close()

    # --- the engine's protocol ---
    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Append tokens to the cache in chunks of n_batch; logits only for the last n_logits."""
        return self._append(tokens, n_logits, self.batch, None)

    def eval_embeddings(self, tokens: Sequence[int], rows: np.ndarray, *, n_logits: int) -> np.ndarray:
        """`eval`, with each position read as its row of `rows` (n, n_embd float32) instead of its token's
        embedding (a hot-vocabulary draft reading a token it has no row for); the cache records `tokens`."""
        if rows.shape != (len(tokens), self.n_embd):
            raise ValueError(f"{rows.shape} embedding rows for {len(tokens)} tokens of width {self.n_embd}")
        if self._embd_batch is None:
            self._embd_batch = llama_cpp.llama_batch_init(self.n_batch, self.n_embd, 1)
        return self._append(tokens, n_logits, self._embd_batch, np.ascontiguousarray(rows, dtype=np.float32))

    def _append(self, tokens: Sequence[int], n_logits: int, batch: Any, rows: np.ndarray | None) -> np.ndarray:
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context overflow: {self.n_past} + {len(tokens)} tokens > {self.n_ctx}")
        if n_logits > min(len(tokens), self.n_batch):
            raise ValueError(f"asked for {n_logits} logits rows from {len(tokens)} tokens")
        self.follow_load()
        started = time.perf_counter()
        self._eval_chunks(tokens, n_logits, batch, rows)
        return self.read_logits(n_logits, started)

    def _eval_chunks(self, tokens: Sequence[int], n_logits: int, batch: Any, rows: np.ndarray | None) -> None:
        for start in range(0, len(tokens), self.n_batch):
            stops.check_stop()  # a request whose client has gone stops here, its chunks so far cached
            chunk = tokens[start : start + self.n_batch]
            first_output = len(tokens) - n_logits - start  # index in this chunk
            if rows is None:
                for i, token in enumerate(chunk):
                    batch.token[i] = token
            else:
                part = rows[start : start + len(chunk)]
                ctypes.memmove(batch.embd, part.ctypes.data, part.nbytes)
            for i in range(len(chunk)):
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i >= first_output
            batch.n_tokens = len(chunk)
            self.decode_batch(batch, stops.current() if len(chunk) >= stops.ABORTABLE_ROWS else None)
            self.cached.extend(chunk)

    def decode_batch(self, batch: llama_cpp.llama_batch, stop: stops.Stop | None = None) -> None:
        """One llama_decode; with `stop`, abandoned once it is set (`Cancelled`, the cache as before)."""
        with self._guard("while decoding"):
            status = decode(self._ctx, batch, stop)
        if status == ABORTED and stop is not None and stop.is_set():
            raise Cancelled("the request was cancelled")
        if status != 0:
            raise DecodeError(f"{self.path.name}: llama_decode failed ({status}): {reason('')}")

    def read_logits(self, n_logits: int, started: float) -> np.ndarray:
        """The last decode's n_logits rows; the time since `started` counts as busy."""
        if n_logits == 0:
            logits = np.empty((0, self.n_vocab), dtype=np.float32)
        else:
            with self._guard("while decoding"):
                pointer = llama_cpp.llama_get_logits(self._ctx)
                logits = np.ctypeslib.as_array(pointer, shape=(n_logits, self.n_vocab)).copy()
        self.busy_seconds += time.perf_counter() - started
        return logits

    def sequence_end(self, seq: int) -> int:
        """The position after sequence `seq`'s last cell (0: it holds none)."""
        with self._guard("while reading the cache"):
            return int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq)) + 1

    def drop_cells(self, seq: int, start: int) -> None:
        """Drop sequence `seq`'s cells from position `start` on (the views' rollback)."""
        with self._guard("while rolling back the cache"):
            llama_cpp.llama_memory_seq_rm(self._memory, seq, start, -1)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Evaluate a tree after the cache in one batch (see the engine's `Model`). A chain is `eval`.

        Each leaf's path is one llama.cpp sequence, which first shares the cached context (`seq_cp`
        of sequence 0); the batch is in depth-first order (tree.py says why)."""
        base = self.n_past
        tree = TreeLayout.plan(base, tokens, parents)
        if tree.chain:
            self._tree = tree
            return self.eval(tokens, n_logits=n_logits)
        if base + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context overflow: {base} + {len(tokens)} tokens > {self.n_ctx}")
        if len(tokens) > self.n_batch or not 0 < n_logits <= len(tokens):
            raise ValueError(f"a tree of {len(tokens)} tokens with {n_logits} logits rows does not fit a batch")
        self.follow_load()
        started = time.perf_counter()
        with self._guard("while decoding"):
            for sequence in range(1, tree.n_sequences):
                llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
                llama_cpp.llama_memory_seq_cp(self._memory, 0, sequence, -1, -1)
        scored = tree.fill(self.batch, n_logits)
        self.decode_batch(self.batch)
        self._tree = tree
        rows = self.read_logits(n_logits, started)  # in batch order: back to the caller's
        return rows[np.argsort(scored)]

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep the pending tree's `path` (root to node) in the cache as sequence 0, drop the rest.
        Only the part of the path that is the batch's first slots stays (tree.py: a kept token after
        a dropped one would make the cache inexact); `cached` says how much."""
        tree, self._tree = self._tree, None
        if tree is None:
            raise ValueError("keep_path without a pending tree")
        if any(tree.parents[node] != (path[i - 1] if i else -1) for i, node in enumerate(path)):
            raise ValueError(f"{list(path)} is not a path from the root of the tree")
        if tree.chain:
            self.rewind(tree.base + len(path))
            return
        kept = path[: tree.exact_prefix(path)]
        # The last kept node's first sequence holds the context and exactly the path up to it.
        sequence = tree.sequences[kept[-1]][0] if kept else 0
        with self._guard("while rolling back the cache"):
            llama_cpp.llama_memory_seq_keep(self._memory, sequence)
            llama_cpp.llama_memory_seq_rm(self._memory, sequence, tree.base + len(kept), -1)
            if sequence != 0:
                llama_cpp.llama_memory_seq_cp(self._memory, sequence, 0, -1, -1)
                llama_cpp.llama_memory_seq_rm(self._memory, sequence, -1, -1)
        self.cached.extend(tree.tokens[node] for node in kept)

    def rewind(self, n_past: int) -> None:
        pending, self._tree = self._tree is not None, None
        if n_past < self.n_past or pending:  # a pending tree's cells lie beyond n_past
            self.drop_cells(-1, n_past)  # every sequence: a tree's other branches go too
            del self.cached[n_past:]

    def clear(self) -> None:
        """Empty the whole KV cache, whatever it holds (e.g. after a call was interrupted)."""
        with self._guard("while clearing the cache"):
            llama_cpp.llama_memory_clear(self._memory, True)
        self.cached.clear()
        self._tree = None

    def save_state(self) -> tuple[bytes, list[int]]:
        """The KV cache as bytes, and the tokens it holds (for the server's cache slots)."""
        with self._guard("while saving the cache"):
            return save_sequence(self._ctx) if self.cached else b"", list(self.cached)

    def load_state(self, state: bytes, tokens: list[int]) -> None:
        """Replace the KV cache with a saved one (`save_state`'s bytes and tokens)."""
        self.clear()
        with self._guard("while restoring the cache"):
            load_sequence(self._ctx, state, self.path.name)
        self.cached = list(tokens)

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # --- text ---
    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Text -> tokens, adding BOS if the model wants it and parsing special tokens."""
        return vocab.tokenize(self._vocab, text, special=special)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for; control tokens (EOS, <|im_end|>) give b''."""
        return vocab.token_bytes(self._vocab, token)

    def control_tokens(self) -> tuple[vocab.ControlToken, ...]:
        """Its control tokens, longest text first (vocab.control_tokens; read once, by one thread: a
        server's first requests each rendering a prompt at once made four scans of the vocabulary,
        each ctypes call a turn for the GIL among busy threads, over a second)."""
        with _CONTROL_TOKENS_READ:
            if getattr(self, "_control_tokens", None) is None:
                self._control_tokens = vocab.control_tokens(self._vocab)
        return self._control_tokens

    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        """Render messages with the GGUF's own chat template, ready for the assistant's turn (with `tools`)."""
        chat_template = self.chat_template()
        if chat_template is None:
            raise PromptError(f"{self.path.name} has no chat template; use --raw to send the text as is")
        eos, bos = (vocab.piece_text(self._vocab, which) for which in ("eos", "bos"))
        return vocab.render_template(chat_template, messages, eos=eos, bos=bos, name=self.path.name, tools=tools)

    def info(self) -> ModelInfo:
        """Description, size and architecture (the server's model listings)."""
        assert self._model is not None, "the model is closed"
        return model_info(self._model)

    def embedder(self) -> Embedder:
        """A pooled embedding context on the same weights, made on first use (then kept)."""
        if getattr(self, "_embedder", None) is None:
            assert self._model is not None, "the model is closed"
            self._embedder = Embedder(self._model, n_ctx=self.n_ctx, n_threads=self.n_threads, name=self.path.name)
        return self._embedder

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens (prefix, suffix, middle), None if the model has none."""
        return fim_tokens(self._vocab)

    # --- what the compatibility check reads ---
    def vocab_info(self) -> VocabInfo:
        return vocab.vocab_info(self._vocab, self.path.name)

    def text_tokenizer(self) -> Callable[[bytes], list[int]]:
        """Bytes -> tokens with no BOS, as a cross-vocabulary draft reads the verifier's text."""
        return vocab.text_tokenizer(self._vocab)
