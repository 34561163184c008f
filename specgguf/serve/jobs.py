"""What every API's routes share around the one worker: set a request up off the event loop
(`set_up`), submit a job, watch for the client hanging up, read the answer whole (`answer`) or hand
its messages to a stream (`messages`, `stream`).
Each API shapes the messages into its own bodies and events; a job that fails is an `ApiError`,
which each API answers in its own error shape. A client that hangs up before its answer is
whole raises `ClientGone` (answered 499, which nobody reads)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..errors import ContextFullError
from ..grammar import MAX_CHECKS, GrammarBusy
from .common import ApiError
from .generator import Delta, Embedded, EmbeddingRequest, Failed, Finished, Job, QueueFull, Worker
from .plan import GenerationRequest
from .text import TokenLogprob

# A request's set-up (its body read into a GenerationRequest: grammars checked, tools planned) runs
# on these threads, the server's own: a grammar's first check holds one for up to
# grammar.COMPILE_SECONDS, and at most grammar.MAX_CHECKS run at once, so the others always find
# a free thread (on the event loop's default pool, 6 threads on 2 cores, twenty slow grammars made
# a plain chat wait 15 s).
SET_UP_THREADS = MAX_CHECKS + 6
_set_ups = ThreadPoolExecutor(SET_UP_THREADS, thread_name_prefix="specgguf-set-up")
_T = TypeVar("_T")


class ClientGone(Exception):
    pass


def busy(why: str, code: str) -> ApiError:
    """A 503 with Retry-After: the server cannot take this request now (its queue is full, or its
    grammar checks are all running); each API answers it in its own shape."""
    return ApiError(
        503,
        f"the server is busy: {why}; try again shortly",
        kind="server_error",
        code=code,
        headers={"Retry-After": "1"},
    )


async def set_up(work: Callable[[], _T]) -> _T:
    """`work`, a request's set-up, off the event loop on the set-up threads; its grammars' checks
    all running already (grammar.GrammarBusy) is a 503."""
    try:
        return await asyncio.get_running_loop().run_in_executor(_set_ups, work)
    except GrammarBusy as error:
        raise busy(str(error), "grammar_checks_busy") from None


class Receiver:
    """A job's messages, watching for the client to hang up while it waits (queued, or not streaming)."""

    def __init__(self, job: Job, request: Request):
        self.job = job
        self._watch = asyncio.ensure_future(self._wait_for_disconnect(request))

    @staticmethod
    async def _wait_for_disconnect(request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def next(self):
        getter = asyncio.ensure_future(self.job.messages.get())
        await asyncio.wait({getter, self._watch}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        self.job.cancelled.set()
        raise ClientGone

    def close(self) -> None:
        self._watch.cancel()


def failure(message: Failed) -> ApiError:
    """A failed job as an error: the request's fault (4xx) or the server's (5xx). A prompt longer than
    the context has OpenAI's code, which client libraries map to their own error."""
    if isinstance(message.error, GrammarBusy):  # (a tool call's grammar, checked as the worker planned)
        return busy(str(message.error), "grammar_checks_busy")
    kind = "invalid_request_error" if message.status < 500 else "server_error"
    code = "context_length_exceeded" if isinstance(message.error, ContextFullError) else None
    return ApiError(message.status, str(message.error), kind=kind, code=code)


def submit(worker: Worker, work: GenerationRequest | EmbeddingRequest) -> Job:
    try:
        return worker.submit(work, asyncio.get_running_loop())
    except QueueFull as error:
        raise busy(str(error), "queue_full") from None


async def started(worker: Worker, generation: GenerationRequest, request: Request) -> Receiver:
    """Queue the generation and wait until it starts (a bad prompt: an ApiError)."""
    receiver = Receiver(submit(worker, generation), request)
    try:
        first = await receiver.next()
    except BaseException:
        receiver.close()
        raise
    if isinstance(first, Failed):
        receiver.close()
        raise failure(first)
    receiver.job.started = first
    return receiver


@dataclass
class Answer:
    text: str
    finished: Finished
    logprobs: list[TokenLogprob]


async def whole(receiver: Receiver) -> Answer:
    """The rest of a started job, collected (the client hanging up: ClientGone)."""
    parts, logprobs = [], []
    try:
        while isinstance(message := await receiver.next(), Delta):
            parts.append(message.text)
            logprobs += message.logprobs
    finally:
        receiver.close()
    if isinstance(message, Failed):
        raise failure(message)
    return Answer("".join(parts), message, logprobs)


async def answer(worker: Worker, generation: GenerationRequest, request: Request, *, stream: bool) -> Answer | Job:
    """Queue a generation and wait for it to start; then its whole answer or, to stream, its job
    (whose `messages` the API turns into events)."""
    receiver = await started(worker, generation, request)
    if stream:
        receiver.close()
        return receiver.job
    return await whole(receiver)


async def messages(job: Job) -> AsyncIterator[Delta | Finished | Failed]:
    """A started job's messages up to its end; a client that hangs up stops the generation."""
    try:
        while True:
            message = await job.messages.get()
            yield message
            if not isinstance(message, Delta):
                return
    finally:
        job.cancelled.set()  # a client that hung up: the generation stops at its next step


def stream(events: AsyncIterator[str], media_type: str = "text/event-stream") -> StreamingResponse:
    """A response that streams `events` as they come (no cache, no proxy buffering)."""
    return StreamingResponse(
        events, media_type=media_type, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def embedded(worker: Worker, work: EmbeddingRequest, request: Request) -> Embedded:
    """An embedding job's one answer."""
    receiver = Receiver(submit(worker, work), request)
    try:
        result = await receiver.next()
    finally:
        receiver.close()
    if isinstance(result, Failed):
        raise failure(result)
    assert isinstance(result, Embedded)
    return result
