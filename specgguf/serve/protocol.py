"""The server's request bodies as pydantic models, and OpenAI-style errors.

Bodies are validated strictly from the raw JSON (`model_validate_json`): a wrong
type, an unknown field or a value out of range is a 400 naming the field. Every
field OpenAI's API reference defines is declared: those that have no meaning for a
local server are accepted and ignored (openai_fields.py lists them), those that
would change the answer and are not done (`n` > 1, images, audio, ...) get a 400
naming them, never a silent ignore.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..conversation import Message, Role, ToolCall
from ..core.drafters import DrafterKind
from ..core.sampling import Penalties, SamplingSettings
from ..grammar import MAX_GRAMMAR_CHARS, GrammarError, GrammarSpec
from .openai_fields import ChatIgnored, CommonIgnored, MessageFields, refuse_chat_extras


class ApiError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}}."""

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


def sampling_from(fields: Any, defaults: SamplingSettings, penalties: Callable[[], Penalties]) -> SamplingSettings:
    """A request's `temperature`, `top_k`, `top_p` and `min_p` over the server's defaults (None: the
    default; top_p 0: only the most likely token, greedy decoding) with `penalties()`; a value out
    of range is a 400."""
    temperature = defaults.temperature if fields.temperature is None else fields.temperature
    top_p = defaults.top_p if fields.top_p is None else fields.top_p
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    try:
        return SamplingSettings(
            temperature=temperature,
            top_k=defaults.top_k if fields.top_k is None else fields.top_k,
            top_p=top_p,
            min_p=defaults.min_p if fields.min_p is None else fields.min_p,
            penalties=penalties(),
        )
    except ValueError as error:
        raise ApiError(400, str(error)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Speculative(_Strict):
    """Per-request drafting: {"k": 8 | "auto" | "adaptive", "drafter": ..., "p_min": ...}."""

    k: Annotated[int, Field(ge=0, le=64)] | Literal["auto", "adaptive"] | None = None
    drafter: DrafterKind | None = None
    p_min: Annotated[float, Field(ge=0.0, le=1.0)] | None = None


class StreamSpeculative(Speculative):  # chat and text completions
    mark_drafts: bool = False  # with stream: each chunk says who wrote its text (draft_marks.py; the page asks)


class JsonSchemaFormat(_Strict):
    """OpenAI's `response_format.json_schema`: the schema the answer validates against (always enforced)."""

    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None  # the grammar enforces the schema either way


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def spec(self) -> GrammarSpec | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return GrammarSpec("json_object")
        if self.json_schema is None:
            raise ApiError(400, "'response_format.json_schema' is missing", param="response_format.json_schema")
        return GrammarSpec.json_schema(
            self.json_schema.schema_ if self.json_schema.schema_ is not None else {"type": "object"},
            "'response_format.json_schema.schema'",
        )


class StreamOptions(_Strict):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # OpenAI's padding against side channels: ignored


_StopString = Annotated[str, Field(max_length=500)]  # held-back text is checked against each, every step


_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
_TokenId = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]


class _Common(CommonIgnored, _Strict):
    """What chat and text completions share."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # 0: only the top token (greedy)
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None  # negative: a random seed (llama.cpp's -1)
    stop: _StopString | Annotated[list[_StopString], Field(max_length=16)] | None = None
    speculative: StreamSpeculative | None = None
    # Applied identically to the verifier's and the draft's logits (core/sampling.apply_penalties).
    logit_bias: dict[_TokenId, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    frequency_penalty: _Penalty | None = None
    presence_penalty: _Penalty | None = None
    # Declared only to be refused by name (see `refuse_unsupported`).
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    response_format: ResponseFormat | None = None
    grammar: Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)] | None = None  # llama-server's GBNF field

    def refuse_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise unsupported("n", "one choice per request")
        if self.stream_options is not None and self.stream_options.include_usage and not self.stream:
            raise ApiError(400, "'stream_options' needs 'stream': true", param="stream_options")
        if self.marks_drafts and not self.stream:
            raise ApiError(400, "'speculative.mark_drafts' needs 'stream': true", param="speculative.mark_drafts")
        if any(stop == "" for stop in self.stop_strings):
            raise ApiError(400, "'stop' strings must not be empty", param="stop")

    def grammar_spec(self) -> GrammarSpec | None:
        """What the answer must follow (`response_format`, or llama-server's `grammar`), checked: a
        grammar that does not compile is a 400 naming the field and the problem."""
        if self.grammar is not None and self.response_format is not None and self.response_format.type != "text":
            raise ApiError(400, "give 'grammar' or a 'response_format', not both", param="grammar")
        param = "grammar" if self.grammar is not None else "response_format"
        try:
            spec = GrammarSpec("gbnf", self.grammar) if self.grammar is not None else None
            spec = spec or (self.response_format.spec() if self.response_format is not None else None)
            if spec is not None:
                spec.compile()
        except GrammarError as error:
            raise ApiError(400, f"'{param}': {error}", param=param, code="invalid_grammar") from None
        return spec

    @property
    def marks_drafts(self) -> bool:
        return self.speculative is not None and self.speculative.mark_drafts

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, defaults: SamplingSettings) -> SamplingSettings:
        return sampling_from(self, defaults, lambda: self.penalties(defaults.penalties))

    def penalties(self, defaults: Penalties) -> Penalties:
        bias = tuple(sorted((int(token), value) for token, value in (self.logit_bias or {}).items()))
        return Penalties(
            frequency=defaults.frequency if self.frequency_penalty is None else self.frequency_penalty,
            presence=defaults.presence if self.presence_penalty is None else self.presence_penalty,
            repeat=defaults.repeat,
            last_n=defaults.last_n,
            bias=bias or defaults.bias,
        )


_ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]  # OpenAI's rule for function names


class FunctionDefinition(_Strict):
    name: _ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: any object
    strict: bool | None = None  # the grammar enforces the schema either way


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(_Strict):
    name: str
    arguments: str


class MessageToolCall(_Strict):
    id: Annotated[str, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(MessageFields, _Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None  # a tool message: the call it answers

    def text(self, index: int) -> str:
        """The content as one string; text parts joined by newlines, anything else refused."""
        where = f"messages[{index}]"
        if self.role == "function":
            raise unsupported(f"{where}.role", "the legacy 'function' role; send 'tool' messages")
        if self.tool_calls and self.role != "assistant":
            raise ApiError(
                400, f"{where}.tool_calls: only assistant messages make tool calls", param=f"{where}.tool_calls"
            )
        self.refuse_extras(where)
        if self.role == "tool" and self.tool_call_id is None:
            raise ApiError(400, f"{where}.tool_call_id is missing", param=f"{where}.tool_call_id")
        if self.content is None and self.tool_calls:
            return ""
        if self.content is None and self.refusal is not None:
            return self.refusal  # an assistant turn that refused: its words are the turn's text
        if self.content is None:
            raise ApiError(400, f"{where}.content is missing", param=f"{where}.content")
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part_index, part in enumerate(self.content):
            param = f"{where}.content[{part_index}]"
            if (
                part.get("type") == "refusal"
                and isinstance(part.get("refusal"), str)
                and set(part) == {"type", "refusal"}
            ):
                texts.append(part["refusal"])
                continue
            if part.get("type") != "text":
                raise unsupported(f"{param}.type", f"only text content, not {str(part.get('type'))[:40]!r}")
            if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                raise ApiError(400, f'{param} must be {{"type": "text", "text": "..."}}', param=param)
            texts.append(part["text"])
        return "\n".join(texts)


_TEMPLATE_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


class ChatRequest(ChatIgnored, _Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        refuse_chat_extras(self)
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                raise unsupported(name, "the legacy function-calling fields; send 'tools' and 'tool_choice'")

    def template_messages(self) -> list[Message]:
        """Messages for the chat template: "developer" is the newer name for "system"."""
        messages, called = [], set()
        for i, message in enumerate(self.messages):
            text = message.text(i)
            called |= {call.id for call in message.tool_calls or []}
            if message.role == "tool" and message.tool_call_id not in called:
                raise ApiError(
                    400,
                    f"messages[{i}] answers a tool call no earlier assistant message made"
                    f" ({str(message.tool_call_id)[:64]!r})",
                    param=f"messages[{i}].tool_call_id",
                )
            calls = tuple(
                ToolCall(call.id, call.function.name, call.function.arguments) for call in message.tool_calls or []
            )
            messages.append(Message(_TEMPLATE_ROLES[message.role], text, calls, message.tool_call_id))
        return messages

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def n_top_logprobs(self) -> int | None:
        """None: no log-probabilities; else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_Common):
    prompt: str | list[str] | _TokenIds | list[_TokenIds]  # a list of several prompts is refused
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # the legacy API: how many alternatives
    echo: bool | None = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=0, le=20)] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise unsupported("echo")
        if self.suffix is not None and self.tokens is not None:
            raise unsupported("suffix", "with a text prompt only")
        if self.best_of not in (None, 0, 1):
            raise unsupported("best_of")
        several = isinstance(self.prompt, list) and not isinstance(self.prompt[0] if self.prompt else 0, int)
        if several and len(self.prompt) != 1:
            raise unsupported("prompt", "one prompt per request (a list of one is fine)")
        if self.tokens is None and not self.text.strip():
            raise ApiError(400, "'prompt' is empty", param="prompt")  # as `run` refuses it

    @property
    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        return self.prompt[0] if isinstance(self.prompt[0], str) else ""

    @property
    def tokens(self) -> list[int] | None:
        """The prompt as token ids, when it was sent so (one list, or a list of one list)."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], str):
            return None
        return self.prompt if isinstance(self.prompt[0], int) else self.prompt[0]

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def n_top_logprobs(self) -> int | None:
        return self.logprobs


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


def parse_body(model: type[_Common], raw: bytes) -> Any:
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
