"""OpenAI's /v1/embeddings from the verifier: a pooled embedding context beside the generating one
(llama/embedding.py), made on the first request; the worker thread runs it between generations."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from pydantic import Field

from ..common import ApiError, Body, ServeOptions, check_model, parse_body, unsupported
from ..generator import MAX_EMBEDDING_INPUTS, EmbeddingRequest, Worker
from ..jobs import embedded

_Tokens = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingsBody(Body):
    input: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | _Tokens
        | Annotated[list[_Tokens], Field(min_length=1)]  # [] was a 500; the count limit: refuse_unsupported
    )
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    def refuse_unsupported(self) -> None:
        if len(self.inputs()) > MAX_EMBEDDING_INPUTS:  # tokens in all: counted on the worker
            raise ApiError(
                400, f"'input' holds {len(self.inputs())} inputs; the limit is {MAX_EMBEDDING_INPUTS}", param="input"
            )
        if any(isinstance(item, str) and not item for item in self.inputs()):
            raise ApiError(400, "'input' must not hold an empty string", param="input")

    def inputs(self) -> list[Any]:
        if isinstance(self.input, str):
            return [self.input]
        return [self.input] if isinstance(self.input[0], int) else list(self.input)


ENDPOINTS: tuple[str, ...] = ("/v1/embeddings",)
ERROR_PREFIXES: tuple[str, ...] = ("/v1/embeddings", "/embeddings")


def error_body(error: ApiError) -> dict:
    """OpenAI's error shape, as on the other /v1 routes."""
    return error.body()


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    async def embeddings(request: Request):
        body: EmbeddingsBody = parse_body(EmbeddingsBody, await request.body())
        check_model(options, body.model)
        n_embd = worker.verifier.info().n_embd
        if body.dimensions not in (None, n_embd):
            raise unsupported("dimensions", f"this model's embeddings have {n_embd}")
        result = await embedded(worker, EmbeddingRequest(body.inputs()), request)
        data = []
        for index, vector in enumerate(result.vectors):
            if body.encoding_format == "base64":
                encoded: Any = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
            else:
                encoded = vector
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        usage = {"prompt_tokens": result.n_tokens, "total_tokens": result.n_tokens}
        return {"object": "list", "data": data, "model": body.model or options.model_name, "usage": usage}

    for path in ("/v1/embeddings", "/embeddings"):
        app.add_api_route(path, embeddings, methods=["POST"], dependencies=dependencies)
