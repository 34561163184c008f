"""What every API of the server shares, and none owns: the server's options (`ServeOptions`),
`ApiError` (an error with its status; each API answers it in its own shape), strict request bodies
(`Body`) read by `parse_body`, OpenAI's `AccountFields` (chat, completions and Responses accept
them), llama-server's `LlamaServerFields` (/infill, chat and completions accept them), the
sampling reader (`sampling_from`: a request's fields over the server's defaults; `llama_sampling`
for llama.cpp-style fields; `samplers_on` for llama-server's `samplers`), specgguf's own
`speculative` field, and a finished answer's `usage` (OpenAI's) and `timings` (llama-server's).

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
from ..kchoice import KChoice, parse_k
from .generator import Finished
from .plan import Speculation
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
    concurrency: str = ""  # the startup line's words for --parallel (app.concurrency)
    webui: bool = True  # the chat page at / (--no-webui: off, / is a 404, the APIs stay)


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


def check_model(options: ServeOptions, name: str | None, refused: Callable[[str], ApiError] | None = None) -> None:
    """--strict-model, the one rule every API follows: a request that names a model other than the one
    served is refused with a 404; no name means the served model, and without --strict-model any name
    does. `refused(name)` (the name cut to 200 characters) is the API's own error where its shape has
    one (Ollama's, Anthropic's); else the OpenAI-shaped one (chat, completions, Responses, embeddings,
    /infill)."""
    if not options.strict_model or name is None or name == options.model_name:
        return
    shown = name[:200]
    if refused is not None:
        raise refused(shown)
    raise ApiError(
        404,
        f"unknown model {shown!r}: this server serves {options.model_name!r} (see GET /v1/models)",
        param="model",
        code="model_not_found",
    )


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
    samplers: list[str] | str | None = None,
) -> SamplingSettings:
    """The one reading of a request's sampling fields over the server's defaults: None is the
    default, top_p 0 only the most likely token (greedy decoding), `penalties()` the request's
    penalties (none: the defaults'), `samplers` llama-server's chain (`samplers_on`); a value out
    of range is a 400."""
    temperature = defaults.temperature if temperature is None else temperature
    top_p = defaults.top_p if top_p is None else top_p
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    try:
        settings = SamplingSettings(
            temperature=temperature,
            top_k=defaults.top_k if top_k is None else top_k,
            top_p=top_p,
            min_p=defaults.min_p if min_p is None else min_p,
            penalties=defaults.penalties if penalties is None else penalties(),
            acceptance=defaults.acceptance,
        )
    except ValueError as error:
        raise ApiError(400, str(error)) from None
    return settings if samplers is None else samplers_on(settings, samplers)


# llama.cpp's sampler names, their other names and one-letter codes (common/sampling.cpp), as the
# knob each is here; None: a sampler not done here, whose own field keeps it off (dry_multiplier 0,
# typical_p 1, xtc_probability 0, top_n_sigma -1), or `infill`, which is not done (docs/serve.md).
_SAMPLERS: dict[str, str | None] = {
    **dict.fromkeys(("top_k", "k"), "top_k"),
    **dict.fromkeys(("top_p", "nucleus", "p"), "top_p"),
    **dict.fromkeys(("min_p", "m"), "min_p"),
    **dict.fromkeys(("temperature", "temp", "t"), "temperature"),
    **dict.fromkeys(("penalties", "e"), "penalties"),
    **dict.fromkeys(("dry", "d", "typ_p", "typical_p", "typical", "y", "xtc", "x"), None),
    **dict.fromkeys(("top_n_sigma", "s", "infill", "i"), None),
}


def samplers_on(settings: SamplingSettings, samplers: list[str] | str) -> SamplingSettings:
    """llama-server's `samplers` (names, or a string of one-letter codes): the samplers in its chain.
    One not named is off, as in llama.cpp's chain: top_k 0, top_p 1, min_p 0, temperature 1 (the
    logits as they are), no penalties (the logit bias stays). The order is not read: the chain here
    is always penalties, top_k, top_p, min_p, temperature. An unknown name is a 400."""
    names = list(samplers) if isinstance(samplers, str) else samplers
    for name in names:
        if name not in _SAMPLERS:
            raise ApiError(400, f"'samplers': unknown sampler {name[:40]!r}", param="samplers")
    on = {_SAMPLERS[name] for name in names}
    bias = settings.penalties.bias
    return SamplingSettings(
        temperature=settings.temperature if "temperature" in on else 1.0,
        top_k=settings.top_k if "top_k" in on else 0,
        top_p=settings.top_p if "top_p" in on else 1.0,
        min_p=settings.min_p if "min_p" in on else 0.0,
        penalties=settings.penalties if "penalties" in on else Penalties(bias=bias),
    )


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


def llama_sampling(
    fields: LlamaSampling, defaults: SamplingSettings, n_ctx: int, samplers: list[str] | str | None = None
) -> SamplingSettings:
    """Sampling from llama.cpp-style fields: temperature, top_k, top_p (0: greedy), min_p,
    repeat/frequency/presence penalties and repeat_last_n (-1: the context), llama-server's `samplers`."""
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
        samplers=samplers,
    )


class Body(BaseModel):
    """A request body, or a part of one: strict types, no unknown field."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def refuse_unsupported(self) -> None:
        """A field whose value would change the answer and is not done here: an ApiError naming it."""


class LlamaServerFields(Body):
    """llama-server's own request fields that its clients send (llama.vscode, llama.vim, its web
    page) beyond the sampling fields each API applies, for /infill, chat and text completions
    (docs/serve.md lists them). Accepted and ignored where the answer is the same without them: the
    slot, the prompt cache (always on), timings and progress reports, the context shift (a prompt
    that does not fit is refused), and the settings of samplers that are off. Refused by name
    (`refuse_llama_extras`) when they turn on what is not done here: DRY, XTC, typical-p, dynamic
    temperature, mirostat, top-n-sigma, min_keep, ignore_eos, LoRA adapters."""

    samplers: list[Annotated[str, Field(max_length=40)]] | Annotated[str, Field(max_length=40)] | None = None
    # Accepted and ignored.
    id_slot: int | None = None
    cache_prompt: bool | None = None
    t_max_prompt_ms: int | None = None
    timings_per_token: bool | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    post_sampling_probs: bool | None = None
    n_keep: int | None = None
    n_discard: int | None = None
    n_cache_reuse: int | None = None
    dynatemp_exponent: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_threshold: float | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    # Refused unless off (llama.cpp's values that turn each off).
    dry_multiplier: float | None = None
    xtc_probability: float | None = None
    typical_p: float | None = None
    dynatemp_range: float | None = None
    mirostat: int | None = None
    top_n_sigma: float | None = None
    min_keep: int | None = None
    ignore_eos: bool | None = None
    lora: list[dict[str, Any]] | None = None

    def refuse_llama_extras(self) -> None:
        for name, is_off in (
            ("dry_multiplier", lambda value: value == 0),
            ("xtc_probability", lambda value: value == 0 or (self.xtc_threshold or 0.1) > 0.5),
            ("typical_p", lambda value: value >= 1),
            ("dynatemp_range", lambda value: value <= 0),
            ("mirostat", lambda value: value == 0),
            ("top_n_sigma", lambda value: value <= 0),
            ("min_keep", lambda value: value <= 1),  # every sampler here keeps at least one token
            ("ignore_eos", lambda value: value is False),
        ):
            value = getattr(self, name)
            if value is not None and not is_off(value):
                raise unsupported(name)
        if any(adapter.get("scale", 1) != 0 for adapter in self.lora or []):
            raise unsupported("lora", "no LoRA adapters")


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
    """Per-request drafting: {"k": 8 | "auto" | "adaptive", "drafter": ..., "p_min": ...,
    "deterministic": true | false (None: the server's --deterministic)}."""

    k: Annotated[int, Field(ge=0, le=64)] | Literal["auto", "adaptive"] | None = None
    drafter: DrafterKind | None = None
    p_min: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    deterministic: bool | None = None

    def speculation(self, *, mark_drafts: bool = False) -> Speculation:
        k = None if self.k is None else parse_k(self.k) if isinstance(self.k, str) else KChoice("fixed", self.k)
        return Speculation(k, self.drafter, self.p_min, mark_drafts, self.deterministic)


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
