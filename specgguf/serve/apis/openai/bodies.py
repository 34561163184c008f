"""OpenAI's chat and text completion request bodies, read by `common.parse_body`. Every field
OpenAI's API reference defines is declared: those that have no meaning for a local server are
accepted and ignored (fields.py lists them), those that would change the answer and are not done
(`n` > 1, images, audio, ...) get a 400 naming them, never a silent ignore.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ....conversation import Message, Role, ToolCall
from ....core.sampling import Penalties, SamplingSettings
from ....grammar import MAX_GRAMMAR_CHARS, GrammarError, GrammarSpec
from ...common import (
    AccountFields,
    ApiError,
    Body,
    LlamaServerFields,
    Speculative,
    plan_tools,
    sampling_from,
    unsupported,
)
from ...tools import Function, ToolPlan
from .fields import ChatIgnored, MessageFields, refuse_chat_extras


class StreamSpeculative(Speculative):
    """`speculative` for chat and text completions: common's drafting fields, and `mark_drafts`."""

    mark_drafts: bool = False  # with stream: each chunk says who wrote its text (draft_marks.py; the page asks)


class JsonSchemaFormat(Body):
    """OpenAI's `response_format.json_schema`: the schema the answer validates against (always enforced)."""

    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None  # the grammar enforces the schema either way


class ResponseFormat(Body):
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


class StreamOptions(Body):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # OpenAI's padding against side channels: ignored


_StopString = Annotated[str, Field(max_length=500)]  # held-back text is checked against each, every step


_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
_TokenId = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]


class _Common(AccountFields, LlamaServerFields, Body):
    """What chat and text completions share, with llama-server's own fields (common.LlamaServerFields;
    its `samplers` applied, others accepted or refused by name)."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | Literal[-1] | None = None  # -1: llama-server's "no limit"
    n_predict: Annotated[int, Field(ge=-1)] | None = None  # llama-server's name; 0: read the prompt, answer nothing
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
    repeat_penalty: Annotated[float, Field(gt=0.0)] | None = None  # llama-server's
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None  # -1: the context
    response_fields: list[str] | None = None  # llama-server's /completion shape only: ignored here
    # Declared only to be refused by name (see `refuse_unsupported`).
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    response_format: ResponseFormat | None = None
    grammar: Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)] | None = None  # llama-server's GBNF field

    def refuse_unsupported(self) -> None:
        self.refuse_llama_extras()
        if self.warm_up and self.stream:
            raise ApiError(400, "'n_predict': 0 (read the prompt only) needs 'stream': false", param="n_predict")
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
    def _limits(self) -> tuple[int | None, ...]:
        """The answer's token limits as given, the one that wins first."""
        return self.max_tokens, self.n_predict

    @property
    def token_limit(self) -> int | None:
        """None: the server's (also for -1, llama-server's "no limit"); n_predict 0: one token, not shown."""
        given = next((limit for limit in self._limits if limit is not None), None)
        return None if given in (None, -1) else max(1, given)

    @property
    def warm_up(self) -> bool:
        """llama-server's n_predict 0 (llama.vim's warm-up): the prompt read into the cache, no answer."""
        return next((limit for limit in self._limits if limit is not None), None) == 0

    @property
    def marks_drafts(self) -> bool:
        return self.speculative is not None and self.speculative.mark_drafts

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, defaults: SamplingSettings, n_ctx: int) -> SamplingSettings:
        return sampling_from(
            defaults,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            penalties=lambda: self.penalties(defaults.penalties, n_ctx),
            samplers=self.samplers,
        )

    def penalties(self, defaults: Penalties, n_ctx: int) -> Penalties:
        bias = tuple(sorted((int(token), value) for token, value in (self.logit_bias or {}).items()))
        last_n = defaults.last_n if self.repeat_last_n is None else self.repeat_last_n
        return Penalties(
            frequency=defaults.frequency if self.frequency_penalty is None else self.frequency_penalty,
            presence=defaults.presence if self.presence_penalty is None else self.presence_penalty,
            repeat=defaults.repeat if self.repeat_penalty is None else self.repeat_penalty,
            last_n=n_ctx if last_n == -1 else last_n,
            bias=bias or defaults.bias,
        )


_ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]  # OpenAI's rule for function names


class FunctionDefinition(Body):
    name: _ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: any object
    strict: bool | None = None  # the grammar enforces the schema either way


class ToolDefinition(Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Body):
    name: str


class ToolChoiceFunction(Body):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(Body):
    name: str
    arguments: str


class MessageToolCall(Body):
    id: Annotated[str, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(MessageFields, Body):
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

    def tool_plan(self) -> ToolPlan | None:
        """The request's tools, checked (tools.plan_tools): None without tools."""
        choice = self.tool_choice
        constrained = self.response_format is not None and self.response_format.type != "text"
        return plan_tools(
            [
                Function(
                    d.function.name, d.function.description, d.function.parameters, f"tools[{i}].function.parameters"
                )
                for i, d in enumerate(self.tools or [])
            ],
            choice=choice if isinstance(choice, str) else None,
            named=None if choice is None or isinstance(choice, str) else choice.function.name,
            parallel=self.parallel_tool_calls is not False,
            called=[
                (call.function.name, f"messages[{i}].tool_calls[{j}].function.name")
                for i, message in enumerate(self.messages)
                for j, call in enumerate(message.tool_calls or [])
            ],
            conflicting="'response_format' or 'grammar'" if constrained or self.grammar is not None else None,
        )

    @property
    def _limits(self) -> tuple[int | None, ...]:
        return self.max_completion_tokens, self.max_tokens, self.n_predict

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
    def n_top_logprobs(self) -> int | None:
        return self.logprobs
