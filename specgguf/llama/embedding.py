"""Pooled embeddings from a loaded model: a second llama.cpp context on the same weights, made with
`embeddings=True`, beside the generating one (whose KV cache it never touches). The model's own
pooling where its GGUF names one, else the mean over the tokens (what a generative model needs);
vectors are L2-normalised, as OpenAI's and llama-server's are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from ..errors import ContextFullError, DecodeError, ModelLoadError
from .runtime import on_decode_thread, reason


class Embedder:
    def __init__(self, model: Any, *, n_ctx: int, n_threads: int, name: str):
        """`model`: the loaded llama_model_p (LlamaModel keeps it)."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_ctx  # a pooled sequence must fit in one micro-batch
        params.n_seq_max = 1
        params.embeddings = True
        params.n_threads = params.n_threads_batch = n_threads
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
        context = llama_cpp.llama_init_from_model(model, params)
        if context and llama_cpp.llama_pooling_type(context) == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            llama_cpp.llama_free(context)  # a generative model: mean pooling instead of none
            params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
            context = llama_cpp.llama_init_from_model(model, params)
        if not context:
            raise ModelLoadError(f"{name}: could not create an embedding context: {reason('out of memory?')}")
        self._ctx, self.name, self.n_ctx = context, name, n_ctx
        self.n_embd = llama_cpp.llama_model_n_embd(model)
        self._batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """One sequence's pooled, normalised embedding."""
        if not tokens:
            raise ValueError("nothing to embed")
        if len(tokens) > self.n_ctx:
            raise ContextFullError(f"the input is {len(tokens)} tokens but the context holds {self.n_ctx}")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(tokens)
        status = on_decode_thread(lambda: llama_cpp.llama_decode(self._ctx, batch))
        if status != 0:
            raise DecodeError(f"{self.name}: llama_decode failed for an embedding ({status}): {reason('')}")
        pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, 0)
        vector = np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).astype(np.float64)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def close(self) -> None:
        if self._ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
