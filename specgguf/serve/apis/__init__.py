"""The server's APIs, one entry each, over the same machinery (common, jobs, plan, generator):
openai (chat and text completions, the models list), responses (OpenAI's Responses API),
embeddings (OpenAI's /v1/embeddings), anthropic (Anthropic's Messages API), ollama (Ollama's
/api/..., its embedding routes in ollama/embed.py), infill (llama-server's /infill).

Each gives its routes (`add_routes`, and `ENDPOINTS`, the paths /metrics counts by name) and its
error shape (`error_body`, for the paths under its `ERROR_PREFIXES`; OpenAI's shape answers every
other path). They import none of each other, and the machinery imports none of them
(pyproject.toml's import contracts).
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI

from ..common import ApiError, ServeOptions
from ..generator import Worker
from . import anthropic, embeddings, infill, ollama, openai, responses


class Api(Protocol):
    ENDPOINTS: tuple[str, ...]  # its paths, as /metrics counts requests
    ERROR_PREFIXES: tuple[str, ...]  # the paths whose errors take this API's shape

    def add_routes(self, app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None: ...

    def error_body(self, error: ApiError) -> dict: ...


APIS: tuple[Api, ...] = (ollama, infill, anthropic, responses, embeddings, openai)
