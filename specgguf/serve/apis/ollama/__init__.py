"""Ollama's API over the same engine: /api/chat, /api/generate (NDJSON streams, as Ollama streams by
default, or one body), /api/tags, /api/show, /api/ps, /api/version; /api/embed and /api/embeddings
in embed.py. `format` ("json" or a JSON schema) constrains the answer as response_format does;
/api/chat's `tools`, the history's `tool_calls` and `tool` messages, and the answer's
`message.tool_calls` are in chat.py.

Its errors are Ollama's `{"error": "..."}` (`error_body`, for every path under /api/). Any model
name means the loaded model (unless --strict-model); `keep_alive` is accepted and ignored (the
model stays loaded while the server runs). `options` map to our sampling as llama.cpp's do.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ....conversation import FimRequest, Message
from ....core.sampling import SamplingSettings
from ....grammar import GrammarSpec
from ...common import (
    ApiError,
    Body,
    ServeOptions,
    check_model,
    checked_grammar,
    llama_sampling,
    parse_body,
    unsupported,
)
from ...generator import Delta, Failed, Finished, Worker
from ...jobs import Answer, answer, messages, set_up, stream
from ...plan import GenerationRequest, Limits, RequestPrompt, RequestSampling
from ...tools import ToolPlan
from . import embed
from .chat import OllamaMessage, OllamaTool, history, tool_calls, tool_plan

OLLAMA_VERSION = "0.12.0"  # the Ollama API this server speaks (clients check it)


class Options(Body):
    """Ollama's options. Load-time ones (num_ctx, num_gpu, ...) are fixed when the server starts:
    accepted and ignored; samplers specgguf does not have are refused unless they are off."""

    num_predict: int | None = None  # -1: as long as the context allows, -2: fill the context
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    # Load time: ignored.
    num_keep: int | None = None
    numa: bool | None = None
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None

    def refuse_unsupported(self) -> None:
        for name, off in (("typical_p", 1.0), ("tfs_z", 1.0), ("mirostat", 0)):
            if getattr(self, name) not in (None, off):
                raise unsupported(f"options.{name}", "specgguf samples with top-k, top-p, min-p and temperature")

    def sampling(self, defaults: SamplingSettings, n_ctx: int) -> SamplingSettings:
        return llama_sampling(self, defaults, n_ctx)

    def max_tokens(self, default: int, n_ctx: int) -> int:
        if self.num_predict is None or self.num_predict == 0:
            return default
        return n_ctx if self.num_predict < 0 else self.num_predict


_Format = Literal["", "json"] | dict[str, Any] | None
_KeepAlive = float | int | str | None


class _Generating(Body):
    model: Annotated[str, Field(min_length=1)]
    stream: bool | None = None  # Ollama streams unless told not to
    options: Options | None = None
    format: _Format = None
    keep_alive: _KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    truncate: bool | None = None
    shift: bool | None = None

    def refuse_unsupported(self) -> None:
        if self.options is not None:
            self.options.refuse_unsupported()
        if self.think not in (None, False):
            raise unsupported("think", "no thinking mode")
        if self.logprobs:
            raise unsupported("logprobs", "use /v1/chat/completions for log-probabilities")

    def grammar(self) -> GrammarSpec | None:
        """`format`: "json" (any JSON object) or a JSON schema the answer follows."""
        if not self.format:
            return None
        spec = GrammarSpec("json_object") if self.format == "json" else GrammarSpec.json_schema(self.format, "'format'")
        return checked_grammar(spec, "format")


class ChatBody(_Generating):
    messages: list[OllamaMessage] = []
    tools: Annotated[list[OllamaTool], Field(max_length=128)] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for index, message in enumerate(self.messages):
            if message.images:
                raise unsupported(f"messages[{index}].images", "text only")

    def history(self) -> list[Message]:
        return history(self.messages)

    def tool_plan(self) -> ToolPlan | None:
        return tool_plan(self.tools or [], self.messages, conflicting="'format'" if self.format else None)


class GenerateBody(_Generating):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.images:
            raise unsupported("images", "text only")
        if self.template:
            raise unsupported("template", "the model's own chat template is used")
        if self.context:
            raise unsupported("context", "send the conversation to /api/chat instead")


class ShowBody(Body):
    model: str | None = None
    name: str | None = None  # the older spelling
    verbose: bool | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _stats(finished: Finished) -> dict:
    stats, ns = finished.stats, 1_000_000_000
    return {
        "done_reason": "length" if finished.finish_reason == "length" else "stop",  # Ollama: "stop" with calls too
        "total_duration": int((stats.wall_seconds + stats.prefill_seconds) * ns),
        "load_duration": 0,
        "prompt_eval_count": finished.n_prompt,  # Ollama: the prompt's tokens (cached ones too)
        "prompt_eval_duration": int(stats.prefill_seconds * ns),
        "eval_count": finished.n_completion,
        "eval_duration": int(stats.wall_seconds * ns),
    }


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    """Ollama's routes on `app`; `dependencies` the API-key check."""
    n_ctx = worker.verifier.n_ctx

    def generation(body: _Generating, prompt: RequestPrompt, tools: ToolPlan | None = None) -> GenerationRequest:
        opts = body.options or Options()
        check_model(options, body.model, embed.not_found)
        return GenerationRequest(
            prompt,
            RequestSampling(opts.sampling(options.settings, n_ctx), opts.seed),
            Limits(opts.max_tokens(options.max_tokens, n_ctx), [stop for stop in opts.stop or [] if stop]),
            grammar=body.grammar(),
            tools=tools,
        )

    async def reply(
        request: Request, body: _Generating, job: GenerationRequest, shape: Callable[[str, Finished | None], dict]
    ):
        result = await answer(
            worker, job, request, stream=body.stream is not False
        )  # Ollama streams unless told not to
        if isinstance(result, Answer):
            return JSONResponse({**shape(result.text, result.finished), "done": True, **_stats(result.finished)})

        async def lines():
            async for message in messages(result):
                if isinstance(message, Delta) and message.text:
                    yield json.dumps({**shape(message.text, None), "done": False}) + "\n"
                elif isinstance(message, Finished):
                    if message.tool_calls:  # Ollama streams a call whole, in a chunk of its own
                        yield json.dumps({**shape("", message), "done": False}) + "\n"
                    yield json.dumps({**shape("", None), "done": True, **_stats(message)}) + "\n"
                elif isinstance(message, Failed):
                    yield json.dumps({"error": str(message.error)}) + "\n"

        return stream(lines(), media_type="application/x-ndjson")

    @app.post("/api/chat", dependencies=dependencies)
    async def chat(request: Request):
        body: ChatBody = parse_body(ChatBody, await request.body())
        if not body.messages:  # Ollama loads the model and answers nothing
            return {"model": body.model, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done_reason": "load", "done": True}  # fmt: skip

        def shape(text: str, finished: Finished | None) -> dict:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if finished is not None and (calls := tool_calls(finished.tool_calls)):
                message["tool_calls"] = calls
            return {"model": body.model, "created_at": _now(), "message": message}

        # Off the event loop: a grammar's first compilation may take up to grammar.COMPILE_SECONDS.
        job = await set_up(lambda: generation(body, RequestPrompt(body.history()), body.tool_plan()))
        return await reply(request, body, job, shape)

    @app.post("/api/generate", dependencies=dependencies)
    async def generate(request: Request):
        body: GenerateBody = parse_body(GenerateBody, await request.body())
        if not body.prompt and not body.suffix:  # Ollama: load the model, answer nothing
            return {"model": body.model, "created_at": _now(), "response": "", "done": True, "done_reason": "load"}
        if body.suffix:  # fill in the middle, framed with the model's FIM tokens
            prompt = RequestPrompt(fim=FimRequest(body.prompt or "", body.suffix))
        elif body.raw:  # the model's raw input: special tokens' texts are those tokens, as Ollama reads them
            prompt = RequestPrompt(text=body.prompt or "", parse_special=True)
        else:
            turns = ([Message("system", body.system)] if body.system else []) + [Message("user", body.prompt or "")]
            prompt = RequestPrompt(turns)
        job = await set_up(lambda: generation(body, prompt))
        return await reply(
            request,
            body,
            job,
            lambda text, _: {"model": body.model, "created_at": _now(), "response": text},
        )

    _add_model_routes(app, worker=worker, options=options, dependencies=dependencies)
    embed.add_embed_routes(app, worker=worker, options=options, dependencies=dependencies)


def _add_model_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    """/api/tags, /api/ps, /api/show and /api/version: the loaded verifier as Ollama lists a model."""
    n_ctx = worker.verifier.n_ctx
    info_cache: dict[str, dict] = {}

    def entry() -> dict:
        if not info_cache:
            info = worker.verifier.info()
            path = worker.verifier.path
            stat = path.stat()
            words = info.description.split()
            info_cache["entry"] = {
                "name": options.model_name,
                "model": options.model_name,
                "modified_at": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(),
                "size": stat.st_size,
                # Not the file's hash (hashing gigabytes at start-up is not worth it): its name, size and time.
                "digest": hashlib.sha256(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest(),
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": info.architecture,
                    "families": [info.architecture],
                    "parameter_size": words[1] if len(words) > 2 else str(info.n_params),
                    "quantization_level": info.file_type or (words[-1] if len(words) > 2 else ""),
                },
                "_info": info,
            }
        return {key: value for key, value in info_cache["entry"].items() if key != "_info"}

    @app.get("/api/tags", dependencies=dependencies)
    async def tags():
        return {"models": [entry()]}

    @app.get("/api/ps", dependencies=dependencies)
    async def ps():
        listed = entry()
        far = datetime.fromtimestamp(time.time() + 10 * 365 * 86400, timezone.utc).isoformat()
        return {"models": [{**listed, "expires_at": far, "size_vram": 0, "context_length": n_ctx}]}

    @app.post("/api/show", dependencies=dependencies)
    async def show(request: Request):
        body: ShowBody = parse_body(ShowBody, await request.body())
        name = body.model or body.name
        if not name:
            raise ApiError(400, "'model' is required", param="model")
        check_model(options, name, embed.not_found)
        listed = entry()
        info = info_cache["entry"]["_info"]
        return {
            "modelfile": f"FROM {worker.verifier.path.name}\n",
            "parameters": "",
            "template": worker.verifier.chat_template() or "",
            "details": listed["details"],
            "model_info": {
                "general.architecture": info.architecture,
                "general.parameter_count": info.n_params,
                f"{info.architecture}.context_length": info.n_ctx_train,
                f"{info.architecture}.embedding_length": info.n_embd,
            },
            "capabilities": ["completion", "tools"],
            "modified_at": listed["modified_at"],
        }

    @app.get("/api/version", dependencies=dependencies)
    async def version():
        return {"version": OLLAMA_VERSION}


ENDPOINTS: tuple[str, ...] = (
    "/api/chat",
    "/api/generate",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
) + embed.ENDPOINTS
ERROR_PREFIXES: tuple[str, ...] = ("/api/",)


def error_body(error: ApiError) -> dict:
    """Ollama's error shape."""
    return {"error": error.message}
