"""One worker thread runs every generation, in arrival order, through `engine.speculate`.

llama.cpp contexts are not thread-safe, and a pair of models can only decode one
sequence at a time here: so the HTTP side never touches a model. It submits a
`Job` to a bounded FIFO queue (full: `QueueFull`, answered 503) and reads the
job's messages (`Started`, `Delta`, `Finished`, `Failed`) from an asyncio queue
that the worker fills with `call_soon_threadsafe`.

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
from dataclasses import dataclass, field

from ..conversation import FimRequest, Message, Prompts, fill_in_middle
from ..core.constraint import Constraint
from ..core.drafters import DRAFTER_KINDS, DrafterKind
from ..core.drafting import common_prefix
from ..core.engine import FixedK, KPolicy
from ..core.ngram_cache import SessionNgrams
from ..core.sampling import SamplingSettings
from ..core.stats import Generation, GenerationStats
from ..errors import ContextFullError, PromptError, SpecggufError, UsageError
from ..grammar import GrammarError, GrammarSpec, constraint_for
from ..prepare import KChoice, Prepared
from .cache_slots import CacheSlots
from .text import AnswerText, TokenLogprob, token_logprobs
from .tool_syntax import SYNTAXES, family_of
from .tools import CallStream, ToolPlan, call_constraint


class QueueFull(Exception):
    pass


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, as typed values (built from a validated request body)."""

    messages: list[Message] | None  # chat: rendered with the verifier's own template (or ChatML)
    text: str  # completions: the raw prompt (tokenized as `run --raw` does)
    max_tokens: int
    settings: SamplingSettings
    seed: int | None
    stops: list[str]
    k: KChoice | None = None  # None: the server's defaults
    drafter: DrafterKind | None = None
    p_min: float | None = None
    n_top_logprobs: int | None = None  # None: no log-probabilities; else alternatives per token
    grammar: GrammarSpec | None = None  # what the answer must follow (response_format, grammar), compiled once already
    tools: ToolPlan | None = None  # the chat request's tools (tools.py)
    prompt_tokens: list[int] | None = None  # the prompt as token ids (then `text` is not read)
    fim: FimRequest | None = None  # fill in the middle, framed with the model's FIM tokens
    n_indent: int = 0  # FIM: stop at a later line indented less than this (llama-server's n_indent)
    t_max_predict_ms: int = 0  # FIM: past this time, stop at the next new line (0: no limit)


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts (or token ids) to embed with the verifier's pooled embedding context."""

    inputs: list[str] | list[list[int]]


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
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI's delta.tool_calls entries


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" or "length"
    n_prompt: int
    n_cached: int
    n_completion: int
    stats: GenerationStats
    first_token_seconds: float | None  # from arrival to the first token
    tool_calls: list[dict] = field(default_factory=list)  # the complete calls (finish_reason "tool_calls")
    stop_string: str | None = None  # the stop string that ended the answer


@dataclass(frozen=True)
class Failed:
    error: SpecggufError
    status: int  # as HTTP would say it: 400 the request's fault, 500 the server's, 503 shutting down


@dataclass(eq=False)  # compared by identity
class Job:
    request: GenerationRequest | EmbeddingRequest
    loop: asyncio.AbstractEventLoop
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def send(self, message) -> None:
        """From the worker thread to the request's coroutine."""
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.messages.put_nowait, message)


class Worker:
    """The loaded pair, the server's drafting defaults, and the worker thread."""

    def __init__(self, *, prepared: Prepared, queue_size: int, metrics=None, cache_slots: int = 1):
        self.prepared = prepared
        self.verifier, self.draft, self.drafting = prepared.verifier, prepared.draft, prepared.options
        self.metrics = metrics
        self.templates = Prompts(self.verifier)
        self.tool_family = family_of(self.verifier.chat_template())  # how this model writes tool calls
        self.prompts = CacheSlots([self.verifier, self.draft], cache_slots)
        self._policies: dict[tuple, tuple[KPolicy, object]] = {}  # adaptive policies keep learning
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
                    self._embed(job, job.request)
                else:
                    self._generate(job)
            except Exception as error:  # noqa: BLE001 - the worker must survive anything; the client hears why
                self._forget_caches()
                job.send(Failed(SpecggufError(f"generation failed: {type(error).__name__}: {error}"), status=500))

    def _embed(self, job: Job, request: EmbeddingRequest) -> None:
        """On the worker thread too: the embedding context shares the weights with the generating one."""
        try:
            tokens = [self.verifier.tokenize(item) if isinstance(item, str) else item for item in request.inputs]
            for index, item in enumerate(tokens):
                if not item:
                    raise PromptError(f"input[{index}] is empty")
                if len(item) > self.verifier.n_ctx:
                    raise ContextFullError(
                        f"input[{index}] is {len(item)} tokens but the context holds {self.verifier.n_ctx}"
                    )
                if max(item) >= self.verifier.n_vocab:
                    raise UsageError(f"input[{index}]: a token id is not in the model's vocabulary")
            embedder = self.verifier.embedder()  # made on first use
        except SpecggufError as error:
            job.send(Failed(error, status=400))
            return
        vectors = [embedder.embed(item).tolist() for item in tokens]
        job.send(Embedded(vectors, sum(len(item) for item in tokens)))

    def _forget_caches(self) -> None:
        """After a failure inside a model call a cache may hold tokens its `cached` list does not."""
        for model in (self.verifier, self.draft):
            if model is not None:
                model.clear()
        self.prompts.forget()

    def _prepare(self, request: GenerationRequest):
        """The prompt's tokens, constraint, drafter and K policy; a bad request raises."""
        if request.prompt_tokens is not None:
            prompt = list(request.prompt_tokens)
        elif request.fim is not None:
            prompt = self._fim_prompt(request)
        else:
            prompt = self._prompt_tokens(request)  # fresh, whatever came before
        self._check_token_ids(request, prompt)
        if not prompt:
            raise PromptError("the prompt is empty")
        if len(prompt) >= self.verifier.n_ctx:
            raise ContextFullError(
                f"the prompt is {len(prompt)} tokens but the context holds"
                f" {self.verifier.n_ctx}; shorten it (or start the server with a larger -c)"
            )
        constraint: Constraint | None
        if request.tools is not None:
            constraint = call_constraint(self.verifier, request.tools, SYNTAXES[self.tool_family])
        else:
            constraint = None if request.grammar is None else constraint_for(self.verifier, request.grammar)
        return prompt, constraint, *self._drafting(request)

    def _fim_prompt(self, request: GenerationRequest) -> list[int]:
        framing = self.verifier.fim_tokens()
        if framing is None:
            raise PromptError(
                "this model has no fill-in-the-middle tokens (FIM prefix/suffix/middle): infill needs"
                " a code model that has them, such as Qwen2.5-Coder"
            )
        assert request.fim is not None
        return fill_in_middle(
            self.templates, request.fim, framing, n_ctx=self.verifier.n_ctx, n_predict=request.max_tokens
        )

    def _check_token_ids(self, request: GenerationRequest, prompt: list[int]) -> None:
        n_vocab = self.verifier.n_vocab
        if request.prompt_tokens is not None and (bad := [t for t in prompt if t >= n_vocab]):
            raise UsageError(f"prompt: token id {bad[0]} is not in the model's vocabulary ({n_vocab} tokens)")
        if bad := [token for token, _ in request.settings.penalties.bias if token >= n_vocab]:
            raise UsageError(f"logit_bias: token id {bad[0]} is not in the model's vocabulary ({n_vocab} tokens)")

    def _generate(self, job: Job) -> None:
        request = job.request
        assert isinstance(request, GenerationRequest)
        try:
            prompt, constraint, drafter, policy = self._prepare(request)
        except SpecggufError as error:
            job.send(Failed(error, status=400))
            return
        self.prompts.select(prompt)  # the cached conversation this prompt continues, if one is parked
        n_cached = common_prefix(self.verifier.cached, prompt[:-1])
        job.send(Started(n_prompt=len(prompt), n_cached=n_cached))
        seed = request.seed if request.seed is not None and request.seed >= 0 else secrets.randbelow(2**31)
        calls, opener, answer = self._answer_text(request)
        logprobs: list[TokenLogprob] = []  # one per generated token, when asked for
        n_top, n_logprobs_sent = request.n_top_logprobs, 0
        generation = self.prepared.generate(
            prompt,
            drafter=drafter,
            policy=policy,
            max_tokens=request.max_tokens,
            settings=request.settings,
            seed=seed,
            constraint=constraint,
        )
        try:
            for event in generation:
                if n_top is not None and event.tokens and event.target_logits is not None:
                    logprobs += token_logprobs(
                        event.target_logits, event.tokens, n_top=n_top, token_bytes=self.verifier.token_bytes
                    )
                fragments = [] if calls is None else calls.feed(event.tokens)
                delta = answer.add(event.tokens)
                if delta and not (calls is not None and calls.opened and not opener):  # a bare-JSON call
                    job.send(Delta(delta, logprobs[n_logprobs_sent : answer.n_tokens_shown()]))
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
        if not cancelled and (delta := answer.finish()):
            job.send(Delta(delta, logprobs[n_logprobs_sent : answer.n_tokens_shown()]))
        finished = _finished(job, prompt, n_cached, answer, calls, opener, generation)
        if self.metrics is not None:
            self.metrics.observe(finished)
        shutdown = Failed(SpecggufError("the server is shutting down"), status=503)
        gone = Failed(SpecggufError("the request was cancelled"), status=499)  # its client hung up
        job.send((shutdown if self._stopping else gone) if cancelled else finished)

    def _answer_text(self, request: GenerationRequest) -> tuple[CallStream | None, list[str], AnswerText]:
        """The answer's text as it comes (stop strings held back), and its tool calls: the content
        ends where a call opens."""
        calls = None if request.tools is None else CallStream(self.tool_family, self.verifier.token_bytes)
        opener = [] if calls is None else calls.syntax.openers
        return calls, opener, AnswerText(self.verifier.token_bytes, request.stops + opener, n_indent=request.n_indent)

    def _new_line_after(self, request: GenerationRequest, generation, tokens: list[int]) -> bool:
        """Whether the time limit (from the first token) has passed and these tokens end a line."""
        started = generation.first_token_at
        elapsed_ms = (time.perf_counter() - started) * 1000 if started is not None else 0.0
        return elapsed_ms > request.t_max_predict_ms and any(b"\n" in self.verifier.token_bytes(t) for t in tokens)

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """A text prompt's tokens, its special tokens parsed (llama-server's); a chat's, the template's
        special tokens parsed but not those in the messages (conversation.Prompts.chat_tokens)."""
        if request.messages is None:
            return self.templates.tokens(request.text, special=True)
        tools = None if request.tools is None else request.tools.definitions
        return self.templates.chat_tokens(request.messages, tools)  # a failing or looping template: PromptError

    def _drafting(self, request: GenerationRequest):
        """The drafter and K policy for a request: the server's defaults, overridden per request."""
        kind = request.drafter or self.drafting.drafter
        choice = request.k or self.drafting.k
        p_min = self.drafting.p_min if request.p_min is None else request.p_min
        if DRAFTER_KINDS[kind].needs_model and self.draft is None and not (choice.mode == "fixed" and choice.k == 0):
            if request.drafter is not None or request.k is not None:
                raise UsageError(
                    f"drafter {kind!r} needs a draft model, and this server has none loaded (start"
                    ' it with -md or --pair, or ask for "drafter": "ngram" or "k": 0)'
                )
            choice = KChoice("fixed", 0)
        # A seeded request drafts without what earlier requests taught the n-gram cache: the same
        # drafts consume the same random numbers, so the same seed gives the same answer.
        session = SessionNgrams() if request.seed is not None else None
        drafter = self.prepared.drafter(kind, p_min=p_min, session=session)
        if choice.mode == "fixed":
            return drafter, FixedK(choice.k or 0)
        key = (choice.mode, kind, request.settings.greedy)
        if key not in self._policies:
            self._policies[key] = self.prepared.policy(choice, temperature=request.settings.temperature, drafter=kind)
        return drafter, self._policies[key][0]


def _finished(
    job: Job, prompt: list[int], n_cached: int, answer: AnswerText, calls, opener: list[str], generation: Generation
) -> Finished:
    """How an answer ended, with its counts and times."""
    stats = generation.stats
    tool_calls = [] if calls is None else calls.calls()
    return Finished(
        finish_reason="tool_calls" if tool_calls else "stop" if answer.stopped or stats.stop == "eos" else "length",
        n_prompt=len(prompt),
        n_cached=n_cached,
        n_completion=answer.n_tokens_used(answer.stopped),
        stats=stats,
        first_token_seconds=None if generation.first_token_at is None else generation.first_token_at - job.arrived,
        tool_calls=tool_calls,
        stop_string=answer.matched if answer.matched not in opener else None,
    )
