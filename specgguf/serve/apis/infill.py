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
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ...conversation import FimRequest
from ...core.sampling import SamplingSettings
from ..common import (
    ApiError,
    Body,
    LlamaServerFields,
    ServeOptions,
    Speculative,
    check_model,
    llama_sampling,
    parse_body,
    timings,
    unsupported,
)
from ..generator import Delta, Failed, Finished, Worker
from ..jobs import Answer, answer, failure, messages, stream
from ..plan import GenerationRequest, Limits, RequestPrompt, RequestSampling

MAX_COMPLETIONS = 8  # llama-server's bound is its slot count (4 by default)


class Chunk(Body):
    text: str = ""
    filename: str = "tmp"
    time: Any = None  # when the editor gathered it (llama.vscode: ms since 1970, llama.vim: reltime()): not read


class InfillBody(LlamaServerFields, Body):
    """The fields llama.vscode and llama.vim send, llama-server's usual sampling ones, and the rest of
    llama-server's (common.LlamaServerFields: its `samplers` applied, others accepted or refused)."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[Chunk], Field(max_length=1024)] = []
    prompt: str = ""
    model: str | None = None
    n_predict: Annotated[int, Field(ge=-1)] | None = None  # -1: the server's limit; 0: only read the prompt
    n_cmpl: Annotated[int, Field(ge=1, le=MAX_COMPLETIONS)] = 1  # several: answered one after another, as a list
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
    n_probs: int | None = None  # refused unless 0

    def refuse_unsupported(self) -> None:
        self.refuse_llama_extras()
        if self.n_probs not in (None, 0):
            raise unsupported("n_probs")
        if self.n_cmpl > 1 and self.stream:
            raise unsupported("n_cmpl", "one completion per stream")

    def sampling(self, defaults: SamplingSettings, n_ctx: int) -> SamplingSettings:
        return llama_sampling(self, defaults, n_ctx, self.samplers)

    def fim_request(self) -> FimRequest:
        """The text around the cursor, the text the middle starts with, and the editor's extra chunks."""
        return FimRequest(
            self.input_prefix,
            self.input_suffix,
            tuple((chunk.filename, chunk.text) for chunk in self.input_extra),
            self.prompt,
        )

    def limit(self, server_max: int) -> int:
        """n_predict as asked: the server's limit for none or -1; 0 reads the prompt and answers nothing."""
        return server_max if self.n_predict in (None, -1) else self.n_predict


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

    def result(text: str, finished: Finished | None, body: InfillBody, index: int = 0) -> dict:
        out: dict = {"index": index, "content": text, "tokens": [], "id_slot": 0, "stop": finished is not None}
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
        check_model(options, body.model)
        n_predict = body.limit(options.max_tokens)
        generation = GenerationRequest(
            RequestPrompt(fim=body.fim_request()),
            RequestSampling(body.sampling(options.settings, n_ctx), body.seed),
            Limits(
                max(1, n_predict),  # 0: the editors' warm-up, the prompt read and no answer
                [stop for stop in body.stop or [] if stop],
                n_indent=body.n_indent,
                t_max_predict_ms=body.t_max_predict_ms,
            ),
            (body.speculative or Speculative()).speculation(),
        )
        if body.n_cmpl > 1 and n_predict:  # llama.vscode's alternatives: a list, as llama-server answers
            return JSONResponse(await _several(worker, generation, request, body.n_cmpl, result, body))
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


async def _several(
    worker: Worker,
    generation: GenerationRequest,
    request: Request,
    n: int,
    result: Callable[[str, Finished, InfillBody, int], dict],
    body: InfillBody,
) -> list[dict]:
    """`n_cmpl` completions of one prompt, one after another (the later ones read it from the cache),
    each its own draw: a seeded request's take the seeds seed, seed + 1, ..."""
    answers = []
    for index in range(n):
        seed = generation.sampling.seed
        seed = seed + index if seed is not None and seed >= 0 else seed
        sampling = replace(generation.sampling, seed=seed)
        reply = await answer(worker, replace(generation, sampling=sampling), request, stream=False)
        assert isinstance(reply, Answer)
        answers.append(result(reply.text, reply.finished, body, index))
    return answers
