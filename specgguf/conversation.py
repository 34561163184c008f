"""The one room for prompts: messages -> the model's chat template (or ChatML) -> tokens.

Every command builds its prompt here, so `run`, `chat`, `bench` and `serve` cannot disagree:

- A GGUF with a chat template gets it; a GGUF without one gets ChatML in every command
  (llama.cpp's fallback too: `llama-cli` and `llama-server` render ChatML for such a model).
  `run --raw` and the server's `/v1/completions` send text as is, no template at all; `run --raw`
  parses the special tokens written in it (`<|im_start|>`...) as llama.cpp's programs do, unless
  `--no-special`.
- A prompt's tokens are always a fresh tokenization of its whole text, as llama-server's are:
  never earlier tokens with the new text's tokens spliced on. (Splicing conditions the model on
  tokens the user never sent: a space-prefix SPM tokenizer puts a space at every seam, a BPE one
  splits a word cut at the seam where the text's own tokenization would merge it.) The caches
  still skip what they hold: the engine keeps the longest common token prefix.
- In a chat prompt, special tokens are read only where the template wrote them: a message's
  content (a tool result, a tool call, a tool's definition) is text, so `<|im_end|>` written in it
  is the characters, not the control token that ends a turn (`Prompts.chat_tokens`). Raw prompts
  (`run --raw`, the server's text completions) are the model's input as written: their special
  tokens are parsed, as llama.cpp's programs and llama-server parse them.
- Text that continues a prompt is tokenized without the BOS a tokenizer puts in front: the
  pieces of a FIM prompt, each framed by FIM tokens, tokenized apart as llama-server's /infill does.
- `fill_in_middle` frames a code-completion request with the model's FIM tokens, as
  llama-server's /infill does (repository-level FIM for the extra chunks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .errors import PromptError

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A function call an assistant message made (OpenAI's shape: arguments as JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    """One message of a conversation, typed; `as_template` is what a chat template reads. An assistant
    message may carry the tool calls it made, a tool message the id of the call it answers."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def as_template(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            # Templates (Qwen2.5's, Llama 3's) write the arguments with `tojson`: an object, as
            # Hugging Face's convention has it, not the JSON text OpenAI sends.
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": _arguments(call)}}
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


class ControlToken(Protocol):
    """A token read in text only where special tokens are parsed (`llama.vocab.ControlToken`)."""

    @property
    def token(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def lstrip(self) -> bool: ...  # it takes the whitespace before it
    @property
    def rstrip(self) -> bool: ...  # and after it


class Templated(Protocol):
    """What the prompts need of the verifier (`llama.model.LlamaModel` is one)."""

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def control_tokens(self) -> Sequence[ControlToken]: ...  # longest text first

    def chat_template(self) -> str | None: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str: ...


def chatml(messages: Sequence[Message], tools: list[dict] | None = None) -> str:
    """The template for a model whose GGUF carries none (llama.cpp's choice too); tools as Hermes
    and Qwen2.5 write them (a system block; calls as <tool_call> JSON)."""
    parts = [_hermes_tools(tools)] if tools else []
    for m in messages:
        calls = "".join(
            f'\n<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n</tool_call>'
            for c in m.tool_calls
        )
        content = f"<tool_response>\n{m.content}\n</tool_response>" if m.role == "tool" else m.content
        parts.append(f"<|im_start|>{'user' if m.role == 'tool' else m.role}\n{content}{calls}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def _hermes_tools(tools: list[dict]) -> str:
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{signatures}\n"
        "</tools>\n\nFor each function call, return a json object with function name and arguments within"
        ' <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments":'
        " <args-json-object>}\n</tool_call><|im_end|>\n"
    )


class Prompts:
    """Prompts for one verifier: rendered, tokenized, continued."""

    def __init__(self, verifier: Templated):
        self.verifier = verifier
        self.has_template = verifier.chat_template() is not None
        self._bos = verifier.tokenize("", special=True)  # what tokenize puts in front of any text

    @property
    def bos(self) -> list[int]:
        """What the tokenizer puts in front of any text (BOS, or nothing)."""
        return list(self._bos)

    def render(self, messages: Sequence[Message], tools: list[dict] | None = None) -> str:
        """The text of a prompt ready for the assistant's turn: the model's template, else ChatML;
        `tools` (OpenAI's tool definitions) go to the template as `tools=`.
        A failing or looping template raises PromptError (llama/vocab.py)."""
        return self._render(messages, tools, lambda text: text)

    def _render(self, messages: Sequence[Message], tools: list[dict] | None, mark: Callable[[str], str]) -> str:
        """`render`, with `mark` applied to every string the template is given."""
        marked_tools = _map_strings(tools, mark) if tools else None
        if not self.has_template:
            return chatml([_map_message(message, mark) for message in messages], marked_tools)
        rendered = [_map_strings(message.as_template(), mark) for message in messages]
        if marked_tools:
            return self.verifier.apply_chat_template(rendered, marked_tools)
        return self.verifier.apply_chat_template(rendered)

    def tokens(self, text: str, *, special: bool = True) -> list[int]:
        """A whole prompt's tokens (BOS where the model wants one)."""
        return self.verifier.tokenize(text, special=special)

    def chat_tokens(self, messages: Sequence[Message], tools: list[dict] | None = None) -> list[int]:
        """A chat prompt's tokens: its rendered text tokenized fresh, as `tokens` does, except that
        special tokens are read only where the template wrote them. A control token's text in a
        message stays text (a message cannot end its turn and forge the next); where no message holds
        one, as in any ordinary conversation, this is `tokens(render(...))` itself."""
        pattern = self._control_pattern()
        if pattern is None or not any(pattern.search(text) for text in _strings(messages, tools)):
            return self.tokens(self.render(messages, tools))
        opening, closing = _markers(self.verifier.chat_template() or "", [*_strings(messages, tools)])
        marked = self._render(messages, tools, lambda text: pattern.sub(f"{opening}\\g<0>{closing}", text))
        text, in_messages = _unmarked(marked, opening, closing, pattern)
        if text != self.render(messages, tools):  # the template did more than copy the messages' text
            raise PromptError(
                "a message holds a control token's text (such as <|im_end|>) that this model's chat"
                " template does not copy as text; remove it from the message"
            )
        return self._tokens_around(text, in_messages)

    def _control_pattern(self) -> re.Pattern[str] | None:
        """A regular expression for any control token's text, the longest first (made once)."""
        if not hasattr(self, "_pattern"):
            texts = [control.text for control in self.verifier.control_tokens()]
            self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
        return self._pattern

    def _tokens_around(self, text: str, in_messages: list[tuple[int, int]]) -> list[int]:
        """`text` tokenized as llama.cpp tokenizes with special tokens parsed (it splits the text at
        each special token's text, longest token first, and tokenizes the pieces between as plain
        text), except that a control token's text at one of the `in_messages` spans is not split at."""
        pieces: list[tuple[int, int] | int] = [(0, len(text))]  # spans of plain text, or control tokens
        for control in [control for control in self.verifier.control_tokens() if control.text in text]:
            pieces = [part for piece in pieces for part in _split(text, piece, control, in_messages)]
        tokens = self.bos
        for piece in pieces:
            tokens += [piece] if isinstance(piece, int) else self.continuation(text[piece[0] : piece[1]], special=False)
        if len(self._bos) == 1 and tokens[:2] == self._bos * 2:
            tokens = tokens[1:]  # a template that writes BOS itself (LlamaModel.tokenize does the same)
        return tokens

    def continuation(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens for text that continues a prompt: no BOS in front."""
        tokens = self.verifier.tokenize(text, special=special)
        return tokens[len(self._bos) :] if self._bos and tokens[: len(self._bos)] == self._bos else tokens

    def question(self, prompt: str, *, raw: bool, system: str | None, special: bool = True) -> list[int]:
        """One question's prompt (`run`, `bench`): rendered with a system prompt, unless raw; raw text has
        its special tokens parsed (llama.cpp's programs do) unless not `special`."""
        if not prompt.strip():
            raise PromptError("the prompt is empty")
        if raw:
            return self.tokens(prompt, special=special)
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
        return self.chat_tokens(messages)

    def history(self, system: str | None, turns: Sequence[tuple[str, str]], question: str) -> list[int]:
        """The prompt for `question` after `turns` of (question, answer text): the whole conversation
        rendered and tokenized fresh, the tokens a server sent the same messages would read (not the
        answers' generated tokens: those need not be what their text tokenizes to)."""
        messages = [Message("system", system)] if system else []
        for asked, answer in turns:
            messages += [Message("user", asked), Message("assistant", answer)]
        return self.chat_tokens([*messages, Message("user", question)])


_SPACES = " \t\n\v\f\r"  # what C's isspace calls whitespace: what a control token's lstrip/rstrip takes


def _split(
    text: str, piece: tuple[int, int] | int, control: ControlToken, in_messages: list[tuple[int, int]]
) -> Iterator[tuple[int, int] | int]:
    """A piece of `text` split at `control`'s text (as llama.cpp's tokenizer_st_partition does),
    except where that text lies in a message."""
    if isinstance(piece, int):
        yield piece
        return
    start, end = piece
    at = text.find(control.text, start, end)
    while at >= 0:
        after = at + len(control.text)
        if any(first < after and at < last for first, last in in_messages):
            at = text.find(control.text, at + 1, end)
            continue
        before = len(text[start:at].rstrip(_SPACES)) + start if control.lstrip else at
        if before > start:
            yield start, before
        yield control.token
        start = len(text) - len(text[after:].lstrip(_SPACES)) if control.rstrip else after
        start = min(start, end)
        at = text.find(control.text, start, end)
    if start < end:
        yield start, end


def _map_strings(value: Any, mark: Callable[[str], str]) -> Any:
    """`value` (JSON-like) with `mark` applied to every string in it, keys too."""
    if isinstance(value, str):
        return mark(value)
    if isinstance(value, dict):
        return {_map_strings(key, mark): _map_strings(item, mark) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(item, mark) for item in value]
    return value


def _map_message(message: Message, mark: Callable[[str], str]) -> Message:
    calls = tuple(ToolCall(mark(call.id), mark(call.name), mark(call.arguments)) for call in message.tool_calls)
    call_id = None if message.tool_call_id is None else mark(message.tool_call_id)
    return Message(message.role, mark(message.content), calls, call_id)


def _strings(messages: Sequence[Message], tools: list[dict] | None) -> Iterator[str]:
    """Every string a template is given (a tool call's arguments both as JSON text and parsed)."""
    yield from _walk([[message.as_template() for message in messages], tools])
    yield from (call.arguments for message in messages for call in message.tool_calls)


def _walk(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(key)
            yield from _walk(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk(item)


def _markers(template: str, texts: list[str]) -> tuple[str, str]:
    """Two private-use characters that neither the template nor any of `texts` holds, as they are or
    as JSON escapes (a template's `tojson` writes them so)."""
    seen = template + "".join(texts)
    free = (
        chr(code) for code in range(0xE000, 0xF900) if chr(code) not in seen and json.dumps(chr(code))[1:-1] not in seen
    )
    return next(free), next(free)


def _unmarked(marked: str, opening: str, closing: str, controls: re.Pattern[str]) -> tuple[str, list[tuple[int, int]]]:
    """The text without the markers, and the spans in it of the control tokens' texts that a message
    held (each between an opening and a closing marker, as they are or as JSON escapes)."""
    forms = {opening: "open", json.dumps(opening)[1:-1]: "open", closing: "close", json.dumps(closing)[1:-1]: "close"}
    markers = re.compile("|".join(map(re.escape, forms)))
    pieces, in_messages, length, position = [], [], 0, 0
    for found in markers.finditer(marked):
        pieces.append(marked[position : found.start()])
        length += found.start() - position
        position = found.end()
        control = controls.match(marked, position) if forms[found.group()] == "open" else None
        after = markers.match(marked, control.end()) if control else None
        if control and after and forms[after.group()] == "close":
            in_messages.append((length, length + len(control.group())))
    pieces.append(marked[position:])
    return "".join(pieces), in_messages


@dataclass(frozen=True)
class FimRequest:
    """A fill-in-the-middle request: the text before and after the cursor, nearby files'
    chunks as (filename, text), and `prompt`, text the middle starts with (after the prefix)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""


class FimFraming(Protocol):
    """The model's FIM tokens (`llama.info.FimTokens`); -1 where it has none."""

    @property
    def prefix(self) -> int: ...
    @property
    def suffix(self) -> int: ...
    @property
    def middle(self) -> int: ...
    @property
    def sep(self) -> int: ...
    @property
    def rep(self) -> int: ...


_SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's chunk separator for models without FIM_SEP


def fill_in_middle(
    prompts: Prompts, fim: FimRequest, framing: FimFraming, *, n_ctx: int, n_predict: int, n_batch: int = 2048
) -> list[int]:
    """The prompt tokens for `fim`, placed as llama-server's `format_infill` places them:
    [FIM_REP]myproject\n [FIM_SEP]file\n chunk ... [FIM_SEP]filename\n (the extra context, cut
    from the front to fit), then [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]; the
    prefix keeps its last 3/4 of a batch (2048 tokens, at most half the context), the suffix its
    first quarter."""
    text = lambda value: prompts.continuation(value, special=False) if value else []  # noqa: E731
    n_batch = min(n_batch, n_ctx // 2)  # a small context still leaves the extra chunks room
    extra: list[int] = []
    if framing.rep >= 0:
        extra += [framing.rep, *text("myproject\n")]
    for filename, chunk in fim.extra:
        extra += [framing.sep, *text(filename + "\n")] if framing.sep >= 0 else text(_SNIPPET)
        extra += text(chunk)
    if framing.sep >= 0:
        extra += [framing.sep, *text("filename\n")]
    prefix, suffix, prompt = text(fim.prefix), text(fim.suffix), text(fim.prompt)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)) :]
    suffix = suffix[: min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    head = extra[len(extra) - n_extra :] + prompts.bos
    return [*head, framing.prefix, *prefix, *prompt, framing.suffix, *suffix, framing.middle]
