"""A GGUF's own chat template, rendered with llama-cpp-python's Jinja formatter; the template is code
from the file, so it runs under a time limit and its failures become one PromptError."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_types import ChatCompletionRequestMessage, ChatCompletionTool

from ..errors import PromptError

if TYPE_CHECKING:
    from _typeshed import TraceFunction

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


def render(
    template: str, messages: list[dict[str, Any]], *, eos: str, bos: str, name: str, tools: list[dict] | None = None
) -> str:
    """Messages rendered with `template`, ready for the assistant's turn; `tools` as the template's `tools`."""

    def render() -> str:
        formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
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
