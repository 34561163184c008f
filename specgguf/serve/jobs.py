"""What every API's routes share around the one worker: submit a generation, watch for the client
hanging up, read the answer whole or as a stream of messages. Each API shapes the messages into
its own bodies and its own errors (`errors`: status, message -> that API's exception)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request

from .generator import Delta, EmbeddingRequest, Failed, Finished, Job, QueueFull, Worker
from .plan import GenerationRequest
from .text import TokenLogprob

ErrorFactory = Callable[[int, str], Exception]  # (HTTP status, message) -> the API's own error


class ClientGone(Exception):
    pass


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


def submit(worker: Worker, generation: GenerationRequest | EmbeddingRequest, errors: ErrorFactory) -> Job:
    try:
        return worker.submit(generation, asyncio.get_running_loop())
    except QueueFull as error:
        raise errors(503, f"the server is busy: {error}; try again shortly") from None


async def started(worker: Worker, generation: GenerationRequest, request: Request, errors: ErrorFactory) -> Receiver:
    """Queue the generation and wait until it starts (a bad prompt: the API's error)."""
    receiver = Receiver(submit(worker, generation, errors), request)
    try:
        first = await receiver.next()
    except BaseException:
        receiver.close()
        raise
    if isinstance(first, Failed):
        receiver.close()
        raise errors(first.status, str(first.error))
    return receiver


@dataclass
class Answer:
    text: str
    finished: Finished
    logprobs: list[TokenLogprob]


async def whole(receiver: Receiver, errors: ErrorFactory) -> Answer:
    """The rest of a started job, collected (the client hanging up: ClientGone)."""
    parts, logprobs = [], []
    try:
        while isinstance(message := await receiver.next(), Delta):
            parts.append(message.text)
            logprobs += message.logprobs
    finally:
        receiver.close()
    if isinstance(message, Failed):
        raise errors(message.status, str(message.error))
    return Answer("".join(parts), message, logprobs)


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
