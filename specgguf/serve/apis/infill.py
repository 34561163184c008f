"""llama-server's `/infill` (what llama.vscode and llama.vim post) over the same engine: the prompt
is framed with the model's FIM tokens (conversation.fill_in_middle), `input_extra` chunks in front
as llama-server places them; `n_indent` and `t_max_predict_ms` stop the middle as llama-server
does. The answer is llama-server's /completion shape (`content`, `stop`, `timings`, ...), whole
or as server-sent events; errors are llama-server's `{"error": {"code", "message", "type"}}`.
The n-gram drafters read prefix, suffix and chunks as part of the prompt: a middle that repeats
nearby code is drafted for free.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ...conversation import FimRequest
from ...core.sampling import SamplingSettings
from ..common import ApiError, Body, ServeOptions, Speculative, llama_sampling, parse_body, timings, unsupported
from ..generator import Delta, Failed, Finished, Worker
from ..jobs import Answer, answer, failure, messages, stream
from ..plan import GenerationRequest, RequestDrafting


class Chunk(Body):
    text: str = ""
    filename: str = "tmp"


class InfillBody(Body):
    """The fields llama.vscode and llama.vim send, and llama-server's usual sampling ones."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[Chunk], Field(max_length=1024)] = []
    prompt: str = ""
    model: str | None = None
    n_predict: Annotated[int, Field(ge=-1)] | None = None  # -1: the server's limit; 0: only read the prompt
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: list[Annotated[str, Field(max_length=500)]] | None = None
    stream: bool | None = False
    n_indent: Annotated[int, Field(ge=0)] = 0
    t_max_predict_ms: Annotated[int, Field(ge=0)] = 0
    repeat_penalty: Annotated[float, Field(gt=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    response_fields: list[str] | None = None
    speculative: Speculative | None = None  # specgguf's own, as on /v1/completions
    # Accepted and ignored: the one slot, the prompt cache (always on), llama.cpp's sampler order.
    id_slot: int | None = None
    cache_prompt: bool | None = None
    samplers: list[str] | None = None
    t_max_prompt_ms: int | None = None
    # Refused unless off.
    n_probs: int | None = None
    typical_p: float | None = None
    mirostat: int | None = None
    ignore_eos: bool | None = None

    def refuse_unsupported(self) -> None:
        for name, off in (("n_probs", 0), ("typical_p", 1.0), ("mirostat", 0), ("ignore_eos", False)):
            if getattr(self, name) not in (None, off):
                raise unsupported(name)

    def sampling(self, defaults: SamplingSettings, n_ctx: int) -> SamplingSettings:
        return llama_sampling(self, defaults, n_ctx)


ENDPOINTS: tuple[str, ...] = ("/infill",)
ERROR_PREFIXES: tuple[str, ...] = ("/infill",)


def error_body(error: ApiError) -> dict:
    """llama-server's error shape."""
    return {"error": {"code": error.status, "message": error.message, "type": error.kind}}


def _pick(body: dict, fields: list[str] | None) -> dict:
    """llama-server's `response_fields`: only these, nested ones named by their path ("timings/prompt_n")."""
    if not fields:
        return body
    picked = {}
    for field in fields:
        value: Any = body
        for part in field.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            picked[field] = value
    return picked


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    n_ctx = worker.verifier.n_ctx

    def result(text: str, finished: Finished | None, body: InfillBody) -> dict:
        out: dict = {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": finished is not None}
        if finished is not None:
            out |= {
                "model": options.model_name,
                "tokens_predicted": finished.n_completion,
                "tokens_evaluated": finished.n_prompt,
                "has_new_line": "\n" in text,
                "truncated": False,
                "stop_type": "eos" if finished.finish_reason == "stop" else "limit",
                "stopping_word": "",
                "tokens_cached": finished.n_prompt + finished.stats.n_tokens,
                "timings": timings(finished),
            }
        return _pick(out, body.response_fields)

    @app.post("/infill", dependencies=dependencies)
    async def infill(request: Request):
        body: InfillBody = parse_body(InfillBody, await request.body())
        if options.strict_model and body.model not in (None, options.model_name):
            raise ApiError(404, f"unknown model {body.model[:200]!r}", param="model")
        n_predict = options.max_tokens if body.n_predict in (None, -1) else body.n_predict
        generation = GenerationRequest(
            messages=None,
            text="",
            max_tokens=max(1, n_predict),  # 0: the editors' warm-up, the prompt read and no answer
            settings=body.sampling(options.settings, n_ctx),
            seed=body.seed,
            stops=[stop for stop in body.stop or [] if stop],
            fim=FimRequest(
                body.input_prefix,
                body.input_suffix,
                tuple((chunk.filename, chunk.text) for chunk in body.input_extra),
                body.prompt,
            ),
            n_indent=body.n_indent,
            t_max_predict_ms=body.t_max_predict_ms,
            drafting=body.speculative.drafting() if body.speculative else RequestDrafting(),
        )
        reply = await answer(worker, generation, request, stream=bool(body.stream))
        if isinstance(reply, Answer):
            return JSONResponse(result(reply.text if n_predict else "", reply.finished, body))

        async def events():
            async for message in messages(reply):
                if isinstance(message, Delta):
                    if n_predict:
                        yield f"data: {json.dumps(result(message.text, None, body))}\n\n"
                elif isinstance(message, Finished):
                    yield f"data: {json.dumps(result('', message, body))}\n\n"
                elif isinstance(message, Failed):
                    yield f"data: {json.dumps(error_body(failure(message)))}\n\n"

        return stream(events())
