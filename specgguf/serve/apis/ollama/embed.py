"""Ollama's embedding routes over the same embedding job as OpenAI's /v1/embeddings (the verifier's
pooled context, generator.py): /api/embed (`input`, a text or a list of texts -> `embeddings`, one
vector each) and the older /api/embeddings (`prompt` -> one `embedding`).

As Ollama: an empty `input` or `prompt` only loads the model (no vectors); `truncate` (default true)
cuts an input longer than the context to it, false refuses it; `dimensions` keeps the first N
values and normalises them again. `options` and `keep_alive` are accepted and change nothing (the
context is fixed when the server starts). Vectors are L2-normalised on both routes (Ollama's older
route gives the raw vector; cosine similarity is the same).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, Request
from pydantic import Field

from ...common import ApiError, Body, ServeOptions, check_model, parse_body
from ...generator import MAX_EMBEDDING_INPUTS, EmbeddingRequest, Worker
from ...jobs import embedded

ENDPOINTS: tuple[str, ...] = ("/api/embed", "/api/embeddings")

_KeepAlive = float | int | str | None


class EmbedBody(Body):
    model: Annotated[str, Field(min_length=1)]
    input: str | Annotated[list[str], Field(max_length=MAX_EMBEDDING_INPUTS)] = ""
    truncate: bool | None = None  # Ollama's default: true
    dimensions: Annotated[int, Field(ge=1)] | None = None
    options: dict[str, Any] | None = None
    keep_alive: _KeepAlive = None

    def inputs(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input] if self.input else []
        return self.input


class EmbeddingsBody(Body):
    """The older route's body."""

    model: Annotated[str, Field(min_length=1)]
    prompt: str | None = None
    options: dict[str, Any] | None = None
    keep_alive: _KeepAlive = None


def _shortened(vector: list[float], dimensions: int | None) -> list[float]:
    """Ollama's `dimensions`: the first N values, normalised again (fewer than the model has)."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = np.asarray(vector[:dimensions])
    norm = float(np.linalg.norm(head))
    return (head / norm if norm > 0 else head).tolist()


def not_found(name: str) -> ApiError:
    """Ollama's answer to a model it does not have (common.check_model, --strict-model)."""
    return ApiError(404, f"model {name!r} not found, try pulling it first")


def add_embed_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    def check(name: str) -> None:
        check_model(options, name, not_found)

    @app.post("/api/embed", dependencies=dependencies)
    async def embed(request: Request):
        arrived = time.perf_counter()
        body: EmbedBody = parse_body(EmbedBody, await request.body())
        check(body.model)
        if not body.inputs():  # Ollama: load the model, embed nothing
            return {"model": body.model, "embeddings": []}
        work = EmbeddingRequest(body.inputs(), truncate=body.truncate is not False)
        result = await embedded(worker, work, request)
        return {
            "model": body.model,
            "embeddings": [_shortened(vector, body.dimensions) for vector in result.vectors],
            "total_duration": int((time.perf_counter() - arrived) * 1e9),
            "load_duration": 0,  # the model was loaded when the server started
            "prompt_eval_count": result.n_tokens,
        }

    @app.post("/api/embeddings", dependencies=dependencies)
    async def embeddings(request: Request):
        body: EmbeddingsBody = parse_body(EmbeddingsBody, await request.body())
        check(body.model)
        if not body.prompt:  # Ollama: load the model, embed nothing
            return {"embedding": []}
        result = await embedded(worker, EmbeddingRequest([body.prompt], truncate=True), request)
        return {"embedding": result.vectors[0]}
