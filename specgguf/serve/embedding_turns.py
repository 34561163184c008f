"""An embedding job, run in turns on the worker's threads (generator.py): the verifier's embedding
context shares its weights with the generating one, so it runs there too, one input at a time (the
context is one: a lock holds it). When a job's turn (`EMBEDDING_TURN_SECONDS`) is over and others wait,
`Embeddings.turn` says so and the worker puts the job at the back of its queue; a client that hangs up
stops it at the next input. Embeddings never use a live sequence (lanes.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..errors import ContextFullError, PromptError, SpecggufError, UsageError
from ..llama.loaded import LoadedModel
from .messages import (
    EMBEDDING_TURN_SECONDS,
    MAX_EMBEDDING_INPUTS,
    MAX_EMBEDDING_TOKENS,
    Embedded,
    EmbeddingProgress,
    EmbeddingRequest,
    Failed,
    Job,
)


class Embeddings:
    """The turns of embedding jobs over the verifier's embedding context. `others_waiting()`: whether
    a job waits in the worker's queue; `stopping()`: whether the server is shutting down."""

    def __init__(
        self, verifier: LoadedModel, *, others_waiting: Callable[[], bool], stopping: Callable[[], bool]
    ) -> None:
        self.verifier = verifier
        self._others_waiting, self._stopping = others_waiting, stopping
        self._context = threading.Lock()  # the one embedding context: one input at a time

    def turn(self, job: Job, request: EmbeddingRequest) -> bool:
        """One turn of an embedding job; False when it has more to do and others are waiting. A client
        that hangs up stops it at the next input."""
        if job.embedding is None:
            try:
                job.embedding = EmbeddingProgress(self._tokens(request))
                with self._context:
                    self.verifier.embedder()  # made on first use
            except SpecggufError as error:
                job.send(Failed(error, status=400))
                return True
        progress, embedder = job.embedding, self.verifier.embedder()
        turn_ends = time.perf_counter() + EMBEDDING_TURN_SECONDS
        while len(progress.vectors) < len(progress.tokens):
            if job.cancelled.is_set():  # its client hung up, or the server is stopping
                status, why = (
                    (503, "the server is shutting down") if self._stopping() else (499, "the request was cancelled")
                )
                job.send(Failed(SpecggufError(why), status=status))
                return True
            if time.perf_counter() > turn_ends and self._others_waiting():
                return False
            with self._context:
                progress.vectors.append(embedder.embed(progress.tokens[len(progress.vectors)]).tolist())
        job.send(Embedded(progress.vectors, sum(len(item) for item in progress.tokens)))
        return True

    def _tokens(self, request: EmbeddingRequest) -> list[list[int]]:
        """The inputs as tokens, checked (and cut to the context when the request says so)."""
        if len(request.inputs) > MAX_EMBEDDING_INPUTS:
            raise UsageError(f"'input' holds {len(request.inputs)} inputs; the limit is {MAX_EMBEDDING_INPUTS}")
        n_ctx, n_tokens = self.verifier.n_ctx, 0
        tokens: list[list[int]] = []
        for index, item in enumerate(request.inputs):
            item_tokens = self.verifier.tokenize(item) if isinstance(item, str) else item
            if not item_tokens:
                raise PromptError(f"input[{index}] is empty")
            if len(item_tokens) > n_ctx and not request.truncate:
                raise ContextFullError(f"input[{index}] is {len(item_tokens)} tokens but the context holds {n_ctx}")
            if max(item_tokens) >= self.verifier.n_vocab:
                raise UsageError(f"input[{index}]: a token id is not in the model's vocabulary")
            tokens.append(item_tokens[:n_ctx])
            n_tokens += len(tokens[-1])
            if n_tokens > MAX_EMBEDDING_TOKENS:
                raise UsageError(
                    f"'input' holds more than {MAX_EMBEDDING_TOKENS} tokens, the limit for one request: split it"
                )
        return tokens
