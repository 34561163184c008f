"""What the server's threads and the HTTP side pass each other: a `Job` (a request and its message
queue), the messages (`Started`, `Delta`, `Finished`, `Failed`, `Embedded`) and an embedding request.
The worker (generator.py) fills a job's queue from its threads with `call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..conversation import ToolCall
from ..core.events import GenerationStats
from ..errors import SpecggufError
from ..llama.stops import Stop
from .draft_marks import Span
from .plan import GenerationRequest
from .text import TokenLogprob
from .tools import CallDelta


class QueueFull(Exception):
    pass


MAX_EMBEDDING_INPUTS = 2048  # inputs in one embedding request (OpenAI's limit)
MAX_EMBEDDING_TOKENS = 300_000  # tokens in all in one embedding request (OpenAI's limit)
EMBEDDING_TURN_SECONDS = 0.25  # an embedding job's turn on the worker while others wait


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts (or token ids) to embed with the verifier's pooled embedding context; `truncate`: an
    input longer than the context is cut to it (Ollama's default) instead of refused."""

    inputs: Sequence[str | list[int]]
    truncate: bool = False


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]
    n_tokens: int


@dataclass(frozen=True)
class Started:
    n_prompt: int
    n_cached: int  # prompt tokens the verifier's cache already held


@dataclass(frozen=True)
class Delta:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # for the tokens this text starts
    tool_calls: list[CallDelta] = field(default_factory=list)  # pieces of the answer's calls
    spans: list[Span] = field(default_factory=list)  # `text` by writer, when the request marks drafts


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" or "length"
    n_prompt: int
    n_cached: int
    n_completion: int
    stats: GenerationStats
    first_token_seconds: float | None  # from arrival to the first token
    tool_calls: list[ToolCall] = field(default_factory=list)  # the complete calls (finish_reason "tool_calls")
    stop_string: str | None = None  # the stop string that ended the answer


@dataclass(frozen=True)
class Failed:
    error: SpecggufError
    status: int  # as HTTP would say it: 400 the request's fault, 500 the server's, 503 shutting down


@dataclass
class EmbeddingProgress:
    """An embedding job between its turns: its inputs' tokens and the vectors made so far."""

    tokens: list[list[int]]
    vectors: list[list[float]] = field(default_factory=list)


@dataclass(eq=False)  # compared by identity
class Job:
    request: GenerationRequest | EmbeddingRequest
    loop: asyncio.AbstractEventLoop
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: Stop = field(default_factory=Stop)  # its client hung up: stops even a pass under way
    arrived: float = field(default_factory=time.perf_counter)
    embedding: EmbeddingProgress | None = None  # an embedding job's progress (it runs in turns)
    started: Started | None = None  # its first message, once jobs.started has read it (the prompt's size)

    def send(self, message) -> None:
        """From the worker thread to the request's coroutine."""
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.messages.put_nowait, message)
