"""A loaded model as the rest of specgguf sees it: how a file loads (`ModelSettings`) and what set-up,
the commands and the server use of it (`LoadedModel`; `llama.model.LlamaModel` is the real one).

`LoadedModel` is `core.model.Model` (what the algorithm needs; restated here, as llama/ imports
nothing from core/) plus the file, the settings its speed depends on (tuning.json's keys), text,
templates and the server's caches. No llama_cpp here until a model loads: the command line imports
this before it knows whether one will.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .compat import VocabInfo
from .rpc import DEFAULT_TIMEOUT, Placement, RpcWorker

if TYPE_CHECKING:
    from .batcher import SequenceView
    from .embedding import Embedder
    from .info import FimTokens, ModelInfo
    from .vocab import ControlToken


class LoadedModel(Protocol):
    n_vocab: int
    n_ctx: int
    max_leaves: int  # the most leaves a tree given to `eval_tree` may have
    cached: list[int]
    path: Path
    n_threads: int
    n_gpu_layers: int
    placement: Placement
    busy_seconds: float  # time spent inside llama.cpp evaluating

    @property
    def n_past(self) -> int: ...

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray: ...

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray: ...

    def keep_path(self, path: Sequence[int]) -> None: ...

    def rewind(self, n_past: int) -> None: ...

    def is_eog(self, token: int) -> bool: ...

    def close(self) -> None: ...

    def clear(self) -> None: ...

    def save_state(self) -> tuple[bytes, list[int]]: ...

    def load_state(self, state: bytes, tokens: list[int]) -> None: ...

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...

    def control_tokens(self) -> Sequence[ControlToken]: ...  # longest text first

    def chat_template(self) -> str | None: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str: ...

    def info(self) -> ModelInfo: ...

    def embedder(self) -> Embedder: ...

    def fim_tokens(self) -> FimTokens | None: ...

    def sequences(  # serve --parallel: a view per sequence
        self, n_seq: int, *, wait_seconds: float = ..., calibrate: bool = False
    ) -> list[SequenceView]: ...

    def kv_bytes_per_sequence(self) -> int: ...

    def vocab_info(self) -> VocabInfo: ...

    def text_tokenizer(self) -> Callable[[bytes], list[int]]: ...


@dataclass(frozen=True)
class ModelSettings:
    """How one model file loads: its context, threads (None: follow the machine's load), GPU layers
    and the RPC workers its layers go to."""

    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = 0
    rpc_workers: Sequence[RpcWorker] = ()
    rpc_timeout: float = DEFAULT_TIMEOUT

    def load(self, path: Path) -> LoadedModel:
        from .model import LlamaModel  # llama.cpp loads only when a model does

        return LlamaModel(
            path,
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_gpu_layers=self.n_gpu_layers,
            rpc_workers=self.rpc_workers,
            rpc_timeout=self.rpc_timeout,
        )
