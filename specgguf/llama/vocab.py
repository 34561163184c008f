"""A GGUF's text side: its vocabulary as `compat.VocabInfo`, from a loaded model or read without
loading weights, and its own chat template, rendered with llama-cpp-python's Jinja formatter
(`render_template`; the template is code from the file, so it runs under a time limit and its failures
become one PromptError)."""

from __future__ import annotations

import ctypes
import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_types import ChatCompletionRequestMessage, ChatCompletionTool

from ..errors import ModelLoadError, PromptError
from .compat import VocabInfo
from .runtime import check_gguf_file, load_model, reason, recent_log

if TYPE_CHECKING:
    from _typeshed import TraceFunction


def vocab_info(vocab: llama_cpp.llama_vocab_p, name: str) -> VocabInfo:
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    return VocabInfo(
        name=name,
        vocab_type=llama_cpp.llama_vocab_type(vocab),
        n_vocab=n_vocab,
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        bos=llama_cpp.llama_vocab_bos(vocab),
        eos=llama_cpp.llama_vocab_eos(vocab),
        token_texts=tuple(llama_cpp.llama_vocab_get_text(vocab, token) for token in range(n_vocab)),
        token_attrs=tuple(int(llama_cpp.llama_vocab_get_attr(vocab, token)) for token in range(n_vocab)),
    )


@dataclass(frozen=True)
class ControlToken:
    """A token llama.cpp reads in text only where it parses special tokens (a control or unknown
    token: `<|im_end|>`, `<eos>`, FIM tokens), and whether it takes the whitespace beside it."""

    token: int
    text: str
    lstrip: bool
    rstrip: bool


def _tokenize_bytes(vocab: llama_cpp.llama_vocab_p, data: bytes, *, add_special: bool, special: bool) -> list[int]:
    """llama_tokenize of `data`, its buffer grown once when llama.cpp says it needs more."""
    capacity = len(data) + 8
    buffer = (llama_cpp.llama_token * capacity)()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, capacity, add_special, special)
    if count < 0:
        buffer = (llama_cpp.llama_token * -count)()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, -count, add_special, special)
    return list(buffer[:count])


def tokenize(vocab: llama_cpp.llama_vocab_p, text: str, *, special: bool) -> list[int]:
    """Text -> tokens, adding BOS if the model wants it (LlamaModel.tokenize)."""
    tokens = _tokenize_bytes(vocab, text.encode("utf-8"), add_special=True, special=special)
    bos = llama_cpp.llama_vocab_bos(vocab)
    if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
        tokens = tokens[1:]  # a template that writes BOS itself, plus add_bos
    return tokens


def token_bytes(vocab: llama_cpp.llama_vocab_p, token: int) -> bytes:
    """The bytes a token stands for; control tokens (EOS, <|im_end|>) give b''."""
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)
    return buffer.raw[:size]


def piece_text(vocab: llama_cpp.llama_vocab_p, which: str) -> str:
    """The text of the vocabulary's "eos" or "bos" token ('' where it has none)."""
    token = getattr(llama_cpp, f"llama_vocab_{which}")(vocab)
    return "" if token < 0 else llama_cpp.llama_vocab_get_text(vocab, token).decode("utf-8", "replace")


def control_tokens(vocab: llama_cpp.llama_vocab_p) -> tuple[ControlToken, ...]:
    """The vocabulary's control tokens, longest text first: the order llama.cpp's tokenizer looks
    for special tokens in (llama_vocab::impl::tokenizer_st_partition)."""
    found = []
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        attr = llama_cpp.llama_vocab_get_attr(vocab, token)
        if not attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN):
            continue
        try:
            text = llama_cpp.llama_vocab_get_text(vocab, token).decode("utf-8")
        except UnicodeDecodeError:  # no text a prompt can hold
            continue
        lstrip, rstrip = attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP, attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        if text:
            found.append(ControlToken(token, text, bool(lstrip), bool(rstrip)))
    return tuple(sorted(found, key=lambda control: (-len(control.text.encode()), control.token)))


def text_tokenizer(vocab: llama_cpp.llama_vocab_p) -> Callable[[bytes], list[int]]:
    """Bytes -> the vocabulary's tokens, as a cross-vocabulary draft reads the verifier's text: no BOS,
    special tokens' texts read as those tokens (core/cross_drafter.py's `Tokenize`)."""

    def tokenize(data: bytes) -> list[int]:
        return _tokenize_bytes(vocab, data, add_special=False, special=True)

    return tokenize


def read_vocab(path: str | Path, *, metadata_keys: Sequence[str] = ()) -> tuple[VocabInfo, dict[str, str]]:
    """A GGUF's vocabulary and some metadata values, loading no weights (for `check` and `pull`)."""
    path = Path(path)
    check_gguf_file(path)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    recent_log.clear()
    model = load_model(path, params)
    if not model:
        raise ModelLoadError(f"{path}: llama.cpp could not read its vocabulary: {reason('unknown error')}")
    try:
        metadata = {}
        for key in metadata_keys:
            buffer = ctypes.create_string_buffer(256)
            size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
            if size >= len(buffer):  # chat templates are long: ask again with room for all of it
                buffer = ctypes.create_string_buffer(size + 1)
                size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
            if size >= 0:
                metadata[key] = buffer.value.decode("utf-8", "replace")
        return vocab_info(llama_cpp.llama_model_get_vocab(model), path.name), metadata
    finally:
        llama_cpp.llama_model_free(model)


# The chat template: code from the file, rendered by llama-cpp-python's Jinja formatter under a time limit.
T = TypeVar("T")
TEMPLATE_SECONDS = 5.0  # a real chat template renders in milliseconds


def within_time(work: Callable[[], T], *, seconds: float) -> T:
    """work(), stopped with TimeoutError if it runs past `seconds` (Python code only: a line tracer
    in this thread checks the clock, so it stops loops in a Jinja template, which compiles to Python)."""
    deadline, ticks = time.monotonic() + seconds, 0
    previous = sys.gettrace()

    def tracer(frame: FrameType, event: str, arg: object) -> TraceFunction:
        nonlocal ticks
        ticks += 1
        if ticks % 256 == 0 and time.monotonic() > deadline:
            raise TimeoutError
        return tracer

    sys.settrace(tracer)
    try:
        return work()
    finally:
        sys.settrace(previous)


@functools.lru_cache(maxsize=8)
def _formatter(template: str, eos: str, bos: str) -> Jinja2ChatFormatter:
    """The template compiled once, then reused (stateless: it renders for any thread). Compiled for
    every request, it cost a chat request's set-up ~25 ms under `within_time`'s tracer."""
    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)


def render_template(
    template: str, messages: list[dict[str, Any]], *, eos: str, bos: str, name: str, tools: list[dict] | None = None
) -> str:
    """Messages rendered with `template`, ready for the assistant's turn; `tools` as the template's `tools`."""

    def render() -> str:
        formatter = _formatter(template, eos, bos)
        # llama-cpp-python types each role's message apart; these are plain role/content dicts.
        return formatter(
            messages=cast("list[ChatCompletionRequestMessage]", messages),
            tools=cast("list[ChatCompletionTool] | None", tools),
        ).prompt

    # The template is code from the file: it may fail, or loop for ever. Neither may escape as
    # a traceback or a hang.
    try:
        return within_time(render, seconds=TEMPLATE_SECONDS)
    except TimeoutError:
        raise PromptError(
            f"{name}'s chat template did not finish within {TEMPLATE_SECONDS:g} s; use --raw to send the text as is"
        ) from None
    except Exception as error:  # noqa: BLE001 - any failure of the file's own code
        detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise PromptError(f"{name}'s chat template failed ({detail}); use --raw to send the text as is") from None
