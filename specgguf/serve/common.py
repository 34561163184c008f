"""What every API of the server shares, and none owns: the server's options (`ServeOptions`),
`ApiError` (an error with its status; each API answers it in its own shape), strict request bodies
(`Body`) read by `parse_body`, OpenAI's `AccountFields` (chat, completions and Responses accept
them), the sampling reader (`sampling_from`: a request's fields over the server's defaults;
`llama_sampling` for llama.cpp-style fields), specgguf's own `speculative` field, and a finished
answer's `usage` (OpenAI's) and `timings` (llama-server's).

Bodies are validated strictly from the raw JSON (`model_validate_json`): a wrong type, an unknown
field or a value out of range is a 400 naming the field; `Body.refuse_unsupported` then refuses,
by name, a value that would change the answer and is not done here (never a silent ignore).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, ParamSpec, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.drafters import DrafterKind
from ..core.sampling import Penalties, SamplingSettings
from ..grammar import GrammarError, GrammarSpec
from ..prepare import KChoice, parse_k
from .generator import Finished
from .plan import RequestDrafting
from .tools import ToolPlan, ToolsError, plan_tools as _plan_tools


@dataclass(frozen=True)
class ServeOptions:
    model_name: str
    max_tokens: int  # when a request gives none
    settings: SamplingSettings  # the defaults a request may override
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    allowed_hosts: tuple[str, ...] = ()  # Host values besides the bound address and localhost
    cors_origins: tuple[str, ...] = ()  # browser origins that may call the API
    strict_model: bool = False  # an unknown `model` is a 404 (else any name means the loaded model)


class ApiError(Exception):
    """An error with its HTTP status. Each API answers it in its own shape; `body` is OpenAI's,
    {"error": {"message", "type", "param", "code"}}, the server's default."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def unsupported(param: str, why: str = "") -> ApiError:
    return ApiError(
        400,
        f"'{param}' is not supported by specgguf{': ' + why if why else ''}",
        param=param,
        code="unsupported_parameter",
    )


def checked_grammar(spec: GrammarSpec, param: str) -> GrammarSpec:
    """A response format's grammar, compiled once to check it: one that does not is a 400 naming `param`."""
    try:
        spec.compile()
    except GrammarError as error:
        raise ApiError(400, f"'{param}': {error}", param=param, code="invalid_grammar") from None
    return spec


_P = ParamSpec("_P")


def _refusing(plan: Callable[_P, ToolPlan | None]) -> Callable[_P, ToolPlan | None]:
    def planned(*args: _P.args, **kwargs: _P.kwargs) -> ToolPlan | None:
        try:
            return plan(*args, **kwargs)
        except ToolsError as error:
            raise ApiError(400, str(error), param=error.param, code=error.code) from None

    return planned


plan_tools = _refusing(_plan_tools)  # tools.plan_tools, its refusal an ApiError (400) naming the request's field


def sampling_from(
    defaults: SamplingSettings,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    penalties: Callable[[], Penalties] | None = None,
) -> SamplingSettings:
    """The one reading of a request's sampling fields over the server's defaults: None is the
    default, top_p 0 only the most likely token (greedy decoding), `penalties()` the request's
    penalties (none: the defaults'); a value out of range is a 400."""
    temperature = defaults.temperature if temperature is None else temperature
    top_p = defaults.top_p if top_p is None else top_p
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    try:
        return SamplingSettings(
            temperature=temperature,
            top_k=defaults.top_k if top_k is None else top_k,
            top_p=top_p,
            min_p=defaults.min_p if min_p is None else min_p,
            penalties=defaults.penalties if penalties is None else penalties(),
        )
    except ValueError as error:
        raise ApiError(400, str(error)) from None


class LlamaSampling(Protocol):
    """llama.cpp-style sampling fields: llama-server's (/infill) and Ollama's `options`."""

    temperature: float | None
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repeat_penalty: float | None
    repeat_last_n: int | None
    frequency_penalty: float | None
    presence_penalty: float | None


def llama_sampling(fields: LlamaSampling, defaults: SamplingSettings, n_ctx: int) -> SamplingSettings:
    """Sampling from llama.cpp-style fields: temperature, top_k, top_p (0: greedy), min_p,
    repeat/frequency/presence penalties and repeat_last_n (-1: the context)."""
    last_n = defaults.penalties.last_n if fields.repeat_last_n is None else fields.repeat_last_n
    return sampling_from(
        defaults,
        temperature=fields.temperature,
        top_k=fields.top_k,
        top_p=fields.top_p,
        min_p=fields.min_p,
        penalties=lambda: Penalties(
            frequency=fields.frequency_penalty or 0.0,
            presence=fields.presence_penalty or 0.0,
            repeat=1.0 if fields.repeat_penalty is None else fields.repeat_penalty,
            last_n=n_ctx if last_n == -1 else last_n,
        ),
    )


class Body(BaseModel):
    """A request body, or a part of one: strict types, no unknown field."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def refuse_unsupported(self) -> None:
        """A field whose value would change the answer and is not done here: an ApiError naming it."""


class AccountFields(Body):
    """What OpenAI's requests (chat and text completions, Responses) carry for the account and for
    OpenAI's storage: accepted; never read by chat and completions (Responses echoes `store`,
    `metadata` and `user` back)."""

    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None


class Speculative(Body):
    """Per-request drafting: {"k": 8 | "auto" | "adaptive", "drafter": ..., "p_min": ...}."""

    k: Annotated[int, Field(ge=0, le=64)] | Literal["auto", "adaptive"] | None = None
    drafter: DrafterKind | None = None
    p_min: Annotated[float, Field(ge=0.0, le=1.0)] | None = None

    def drafting(self) -> RequestDrafting:
        k = None if self.k is None else parse_k(self.k) if isinstance(self.k, str) else KChoice("fixed", self.k)
        return RequestDrafting(k, self.drafter, self.p_min)


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param_name(loc: tuple) -> str | None:
    """("messages", 0, "role") -> "messages[0].role", leaving out pydantic's union-member tags."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.isidentifier() and part not in _UNION_TAGS:
            name += f".{part}" if name else part
    return name or None


BodyType = TypeVar("BodyType", bound=Body)


def parse_body(model: type[BodyType], raw: bytes) -> BodyType:
    """The request body as `model`, or an ApiError (400) that names the first bad field."""
    try:
        request = model.model_validate_json(raw)
    except ValidationError as error:
        # Of a union's failed branches, the deepest error says most ("stop[0]: too long", not "not a string").
        first = max(error.errors(include_url=False), key=lambda detail: len(_param_name(detail["loc"]) or ""))
        if first["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON: {first['msg']}") from None
        if first["type"] == "model_type" and not first["loc"]:
            raise ApiError(400, "the body must be a JSON object") from None
        param = _param_name(first["loc"])
        # A union's branches failing at the same place: say what each would have taken.
        messages = dict.fromkeys(
            detail["msg"] for detail in error.errors(include_url=False) if _param_name(detail["loc"]) == param
        )
        message = "unknown field" if first["type"] == "extra_forbidden" else "; or ".join(messages)
        raise ApiError(400, f"'{param}': {message}" if param else message, param=param) from None
    request.refuse_unsupported()
    return request


def usage(finished: Finished) -> dict:
    return {
        "prompt_tokens": finished.n_prompt,
        "completion_tokens": finished.n_completion,
        "total_tokens": finished.n_prompt + finished.n_completion,
        "prompt_tokens_details": {"cached_tokens": finished.n_cached},
    }


def timings(finished: Finished) -> dict:
    """llama-server's names, so tools written for it read them unchanged. prompt_n counts the prompt
    tokens evaluated, cache_n those the verifier's cache already held; predicted_n every generated
    token (after a stop string too); draft_n / draft_n_accepted the drafts proposed / accepted."""
    stats = finished.stats
    prompt_n = finished.n_prompt - finished.n_cached
    prompt_ms, predicted_ms = stats.prefill_seconds * 1000, stats.wall_seconds * 1000
    return {
        "cache_n": finished.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n / prompt_ms * 1000, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": stats.n_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / stats.n_tokens, 3) if stats.n_tokens else 0.0,
        "predicted_per_second": round(stats.tokens_per_second, 3),
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
        # specgguf's own: accepted drafts by who proposed them ("model", "ngram", "grammar": forced tokens)
        "draft_n_accepted_by_source": dict(stats.accepted_by_source),
    }
