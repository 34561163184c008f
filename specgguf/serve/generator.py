"""One worker thread runs every generation, in arrival order, through `engine.speculate`: it plans
each request (plan.py) and runs the plan. It imports no API; tool calls come out as API-neutral
values (tools.CallDelta while streaming, conversation.ToolCall whole) that each API shapes.

llama.cpp contexts are not thread-safe, and a pair of models can only decode one
sequence at a time here: so the HTTP side never touches a model. It submits a
`Job` to a bounded FIFO queue (full: `QueueFull`, answered 503) and reads the
job's messages (`Started`, `Delta`, `Finished`, `Failed`) from an asyncio queue
that the worker fills with `call_soon_threadsafe`. An embedding job runs in turns: when its turn
(`EMBEDDING_TURN_SECONDS`) is over and others wait, it goes to the back of the queue; its client
hanging up stops it at the next input.

Prefix reuse: a prompt is always the fresh tokenization of the request's whole text
(as llama-server's is), and the engine keeps whatever token prefix of it each
model's KV cache already holds; with `--cache-slots N`, the cache of the
conversation that shares the most (cache_slots.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..conversation import Prompts, ToolCall
from ..core.drafting import common_prefix
from ..core.stats import Generation, GenerationStats
from ..errors import ContextFullError, PromptError, SpecggufError, UsageError
from ..grammar import GrammarError
from ..prepare import Prepared
from .cache_slots import CacheSlots
from .draft_marks import DraftMarks, Span
from .plan import GenerationRequest, Planner
from .text import AnswerText, TokenLogprob, token_logprobs
from .tool_syntax import family_of
from .tools import CallDelta, CallStream, call_stream


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
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    embedding: EmbeddingProgress | None = None  # an embedding job's progress (it runs in turns)
    started: Started | None = None  # its first message, once jobs.started has read it (the prompt's size)

    def send(self, message) -> None:
        """From the worker thread to the request's coroutine."""
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.messages.put_nowait, message)


class Worker:
    """The loaded pair, the planner (plan.py) and the worker thread that runs its plans."""

    def __init__(self, *, prepared: Prepared, queue_size: int, metrics=None, cache_slots: int = 1):
        self.prepared = prepared
        self.verifier, self.draft = prepared.verifier, prepared.draft
        self.metrics = metrics
        self.templates = Prompts(self.verifier)
        self.tool_family = family_of(self.verifier.chat_template())  # how this model writes tool calls
        self.prompts = CacheSlots([self.verifier, self.draft], cache_slots)
        self.planner = Planner(prepared=prepared, templates=self.templates, tool_family=self.tool_family)
        self._waiting: deque[Job] = deque()  # FIFO; a job whose client left is dropped from it
        self._running: Job | None = None
        self._queue_size = queue_size
        self._changed = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="specgguf-generator", daemon=True)
        self._thread.start()

    def _drop_cancelled(self) -> None:
        """(Holding the lock.) A job cancelled while waiting gives its place up at once."""
        if any(job.cancelled.is_set() for job in self._waiting):
            self._waiting = deque(job for job in self._waiting if not job.cancelled.is_set())

    @property
    def n_waiting(self) -> int:
        with self._changed:
            self._drop_cancelled()
            return len(self._waiting)

    def submit(self, request: GenerationRequest | EmbeddingRequest, loop: asyncio.AbstractEventLoop) -> Job:
        job = Job(request, loop)
        with self._changed:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            self._drop_cancelled()
            if len(self._waiting) >= self._queue_size:
                raise QueueFull(f"{self._queue_size} requests are already waiting")
            self._waiting.append(job)
            self._changed.notify()
        return job

    def stop(self) -> None:
        """Cancel every job (the running one stops after its current step) and end the worker."""
        with self._changed:
            self._stopping = True
            for job in self._waiting:
                job.cancelled.set()
                job.send(Failed(SpecggufError("the server is shutting down"), status=503))
            self._waiting.clear()
            if self._running is not None:
                self._running.cancelled.set()
            self._changed.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # --- the worker thread ---
    def _next_job(self) -> Job | None:
        with self._changed:
            self._running = None
            while True:
                self._drop_cancelled()
                if self._stopping:
                    return None
                if self._waiting:
                    self._running = self._waiting.popleft()
                    return self._running
                self._changed.wait()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            try:
                if isinstance(job.request, EmbeddingRequest):
                    if not self._embed(job, job.request):
                        self._wait_again(job)
                else:
                    self._generate(job)
            except Exception as error:  # noqa: BLE001 - the worker must survive anything; the client hears why
                self._forget_caches()
                job.send(Failed(SpecggufError(f"generation failed: {type(error).__name__}: {error}"), status=500))

    def _wait_again(self, job: Job) -> None:
        """An embedding job whose turn is over goes to the back of the queue (past its limit: it waited already)."""
        with self._changed:
            if self._stopping:
                job.send(Failed(SpecggufError("the server is shutting down"), status=503))
            else:
                self._waiting.append(job)

    def _others_waiting(self) -> bool:
        with self._changed:
            self._drop_cancelled()
            return bool(self._waiting)

    def _embed(self, job: Job, request: EmbeddingRequest) -> bool:
        """One turn of an embedding job; False when it has more to do and others are waiting. On the
        worker thread too: the embedding context shares the weights with the generating one. A client
        that hangs up stops it at the next input."""
        if job.embedding is None:
            try:
                job.embedding = EmbeddingProgress(self._embedding_tokens(request))
                self.verifier.embedder()  # made on first use
            except SpecggufError as error:
                job.send(Failed(error, status=400))
                return True
        progress, embedder = job.embedding, self.verifier.embedder()
        turn_ends = time.perf_counter() + EMBEDDING_TURN_SECONDS
        while len(progress.vectors) < len(progress.tokens):
            if job.cancelled.is_set():  # its client hung up, or the server is stopping
                status, why = (
                    (503, "the server is shutting down") if self._stopping else (499, "the request was cancelled")
                )
                job.send(Failed(SpecggufError(why), status=status))
                return True
            if time.perf_counter() > turn_ends and self._others_waiting():
                return False
            progress.vectors.append(embedder.embed(progress.tokens[len(progress.vectors)]).tolist())
        job.send(Embedded(progress.vectors, sum(len(item) for item in progress.tokens)))
        return True

    def _embedding_tokens(self, request: EmbeddingRequest) -> list[list[int]]:
        """The inputs as tokens, checked (and cut to the context when the request says so)."""
        if len(request.inputs) > MAX_EMBEDDING_INPUTS:
            raise UsageError(f"'input' holds {len(request.inputs)} inputs; the limit is {MAX_EMBEDDING_INPUTS}")
        n_ctx, n_tokens = self.verifier.n_ctx, 0
        tokens: list[list[int]] = []
        for index, item in enumerate(request.inputs):
            item_tokens = self.verifier.tokenize(item) if isinstance(item, str) else item
            if not item_tokens:
                raise PromptError(f"input[{index}] is empty")
            if len(item_tokens) > n_ctx and not request.truncate:
                raise ContextFullError(f"input[{index}] is {len(item_tokens)} tokens but the context holds {n_ctx}")
            if max(item_tokens) >= self.verifier.n_vocab:
                raise UsageError(f"input[{index}]: a token id is not in the model's vocabulary")
            tokens.append(item_tokens[:n_ctx])
            n_tokens += len(tokens[-1])
            if n_tokens > MAX_EMBEDDING_TOKENS:
                raise UsageError(
                    f"'input' holds more than {MAX_EMBEDDING_TOKENS} tokens, the limit for one request: split it"
                )
        return tokens

    def _forget_caches(self) -> None:
        """After a failure inside a model call a cache may hold tokens its `cached` list does not."""
        for model in (self.verifier, self.draft):
            if model is not None:
                model.clear()
        self.prompts.forget()

    def _generate(self, job: Job) -> None:
        request = job.request
        assert isinstance(request, GenerationRequest)
        try:
            plan = self.planner.plan(request)
        except SpecggufError as error:
            job.send(Failed(error, status=400))
            return
        prompt = plan.prompt
        self.prompts.select(prompt)  # the cached conversation this prompt continues, if one is parked
        n_cached = common_prefix(self.verifier.cached, prompt[:-1])
        job.send(Started(n_prompt=len(prompt), n_cached=n_cached))
        seed = request.seed if request.seed is not None and request.seed >= 0 else secrets.randbelow(2**31)
        calls, opener, answer = self._answer_text(request)
        logprobs: list[TokenLogprob] = []  # one per generated token, when asked for
        n_top, n_logprobs_sent = request.n_top_logprobs, 0
        marks = DraftMarks(self.verifier.token_bytes) if request.mark_drafts else None
        generation = self.prepared.generate(
            prompt,
            drafter=plan.drafter,
            policy=plan.policy,
            max_tokens=request.max_tokens,
            settings=request.settings,
            seed=seed,
            constraint=plan.constraint,
        )
        try:
            for event in generation:
                if n_top is not None and event.tokens and event.target_logits is not None:
                    logprobs += token_logprobs(
                        event.target_logits, event.tokens, n_top=n_top, token_bytes=self.verifier.token_bytes
                    )
                fragments = [] if calls is None else calls.feed(event.tokens)
                text = answer.add(event.tokens)
                delta = text if calls is None else calls.content(text)
                # Marks follow the answer's text; with tools its content is held back and cut, unmarked.
                spans = [] if marks is None or calls is not None else marks.step(event, delta)
                if delta:
                    job.send(Delta(delta, logprobs[n_logprobs_sent : answer.n_tokens_shown()], spans=spans))
                    n_logprobs_sent = max(n_logprobs_sent, answer.n_tokens_shown())
                if fragments:
                    job.send(Delta("", tool_calls=fragments))
                if (answer.stopped and not (calls is not None and calls.opened)) or job.cancelled.is_set():
                    break
                if request.t_max_predict_ms and self._new_line_after(request, generation, event.tokens):
                    break  # FIM's time limit: the answer ends at this line's end ("length")
        except SpecggufError as error:
            self._forget_caches()
            job.send(Failed(error, status=400 if isinstance(error, GrammarError) else 500))  # a grammar's dead end
            return
        finally:
            generation.close()  # the engine stops at a step boundary: both caches stay consistent
        cancelled = job.cancelled.is_set() and not answer.stopped
        ending = answer.finish() if calls is None else calls.finish(answer, generation.stats.stop)
        if not cancelled and ending:
            spans = [] if marks is None or calls is not None else marks.spans(ending)
            job.send(Delta(ending, logprobs[n_logprobs_sent : answer.n_tokens_shown()], spans=spans))
        finished = _finished(job, prompt, n_cached, answer, calls, opener, generation)
        if self.metrics is not None:
            self.metrics.observe(finished)
        shutdown = Failed(SpecggufError("the server is shutting down"), status=503)
        gone = Failed(SpecggufError("the request was cancelled"), status=499)  # its client hung up
        job.send((shutdown if self._stopping else gone) if cancelled else finished)

    def _answer_text(self, request: GenerationRequest) -> tuple[CallStream | None, list[str], AnswerText]:
        """The answer's text as it comes (stop strings held back), and its calls (the content ends there)."""
        calls = call_stream(request.tools, self.tool_family, self.verifier.token_bytes)
        opener = [] if calls is None else calls.syntax.openers
        return calls, opener, AnswerText(self.verifier.token_bytes, request.stops + opener, n_indent=request.n_indent)

    def _new_line_after(self, request: GenerationRequest, generation, tokens: list[int]) -> bool:
        """Whether the time limit (from the first token) has passed and these tokens end a line."""
        started = generation.first_token_at
        elapsed_ms = (time.perf_counter() - started) * 1000 if started is not None else 0.0
        return elapsed_ms > request.t_max_predict_ms and any(b"\n" in self.verifier.token_bytes(t) for t in tokens)


def _finished(
    job: Job, prompt: list[int], n_cached: int, answer: AnswerText, calls, opener: list[str], generation: Generation
) -> Finished:
    """How an answer ended, with its counts and times."""
    stats = generation.stats
    reason, tool_calls = (None, []) if calls is None else calls.result()
    return Finished(
        finish_reason=reason or ("stop" if answer.stopped or stats.stop == "eos" else "length"),
        n_prompt=len(prompt),
        n_cached=n_cached,
        n_completion=stats.n_tokens if answer.matched in opener else answer.n_tokens_used(answer.stopped),
        stats=stats,
        first_token_seconds=None if generation.first_token_at is None else generation.first_token_at - job.arrived,
        tool_calls=tool_calls,
        stop_string=answer.matched if answer.matched not in opener else None,
    )
