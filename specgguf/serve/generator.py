"""The worker: its threads run every generation through `engine.speculate`, taking requests in
arrival order: each plans a request (plan.py) and runs the plan. It imports no API; tool calls come
out as API-neutral values (tools.CallDelta while streaming, conversation.ToolCall whole) that each
API shapes.

llama.cpp contexts are not thread-safe, so the HTTP side never touches a model. It submits a `Job`
to a bounded FIFO queue (full: `QueueFull`, answered 503) and reads the job's messages (`Started`,
`Delta`, `Finished`, `Failed`; messages.py) from an asyncio queue that the worker fills with
`call_soon_threadsafe`. An embedding job runs in turns on the same threads (embedding_turns.py): when
its turn is over and others wait, it goes to the back of the queue.

`--parallel 1`: one thread and the models' own caches, one request at a time. `--parallel N`: N
threads, each running one request at a time on a live sequence of its own (parallel/lanes.py), their model
calls batched together (llama/batcher.py); a request waits in the queue only while N others run.

Prefix reuse: a prompt is always the fresh tokenization of the request's whole text (as
llama-server's is), and the engine keeps whatever token prefix of it each model's KV cache already
holds: with --parallel N, the lane that holds the most of it; with --parallel 1 and `--cache-slots
N`, the cache of the conversation that shares the most (cache_slots.py).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import deque
from dataclasses import replace

from ..conversation import Prompts
from ..core.drafting import reusable
from ..core.events import Generation
from ..core.model import Model
from ..errors import Cancelled, SpecggufError
from ..grammar import GrammarBusy, GrammarError
from ..llama.stops import stops_when
from ..prepare import Prepared
from .cache_slots import CacheSlots
from .draft_marks import DraftMarks
from .embedding_turns import Embeddings
from .line_end import LineEndDrafter
from .messages import (  # re-exported: the APIs read them from here
    MAX_EMBEDDING_INPUTS,
    Delta,
    Embedded,
    EmbeddingRequest,
    Failed,
    Finished,
    Job,
    QueueFull,
    Started,
)
from .parallel.lanes import Lanes
from .plan import GenerationRequest, Plan, Planner
from .text import AnswerText, TokenLogprob, time_cut, token_logprobs
from .tool_syntax import family_of
from .tools import CallStream, call_stream

__all__ = [
    "MAX_EMBEDDING_INPUTS",
    "Delta",
    "Embedded",
    "EmbeddingRequest",
    "Failed",
    "Finished",
    "Job",
    "QueueFull",
    "Started",
    "Worker",
]


class Worker:
    """The loaded pair, the planner (plan.py) and the threads that run its plans (`parallel` of them,
    each on a live sequence of its own when more than one)."""

    def __init__(
        self,
        *,
        prepared: Prepared,
        queue_size: int,
        metrics=None,
        cache_slots: int = 1,
        parallel: int = 1,
        deterministic: bool = False,
    ):
        self.prepared = prepared
        self.verifier, self.draft = prepared.verifier, prepared.draft
        self.metrics = metrics
        self.templates = Prompts(self.verifier)
        self.verifier.control_tokens()  # read now (a vocabulary scan), not by the first requests at once
        self.tool_family = family_of(self.verifier.chat_template())  # how this model writes tool calls
        self.parallel = max(1, parallel)
        # --parallel N: the lanes are the cached conversations; --parallel 1: one cache, and parked ones.
        self.lanes = None
        if self.parallel > 1:
            # The costs are measured on the models' own caches, which the lanes' sequences replace:
            # now, before them, where a request could later want them (an adaptive K).
            _ = prepared.costs
            self.lanes = Lanes(self.verifier, self.draft, self.parallel)
        self.prompts = CacheSlots([self.verifier, self.draft], cache_slots if self.lanes is None else 1)
        self.planner = Planner(
            prepared=prepared, templates=self.templates, tool_family=self.tool_family, deterministic=deterministic
        )
        self._waiting: deque[Job] = deque()  # FIFO; a job whose client left is dropped from it
        self._running: set[Job] = set()
        self._queue_size = queue_size
        self._changed = threading.Condition()
        self._stopping = False
        self.embeddings = Embeddings(
            self.verifier, others_waiting=self._others_waiting, stopping=lambda: self._stopping
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"specgguf-generator-{index}", daemon=True)
            for index in range(self.parallel)
        ]
        for thread in self._threads:
            thread.start()

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
            for job in self._running:
                job.cancelled.set()
            self._changed.notify_all()

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # --- the worker's threads ---
    def _next_job(self, finished: Job | None) -> Job | None:
        with self._changed:
            if finished is not None:
                self._running.discard(finished)
            while True:
                self._drop_cancelled()
                if self._stopping:
                    return None
                if self._waiting:
                    job = self._waiting.popleft()
                    self._running.add(job)
                    return job
                self._changed.wait()

    def _work(self) -> None:
        finished: Job | None = None
        while (job := self._next_job(finished)) is not None:
            finished = job
            try:
                if isinstance(job.request, EmbeddingRequest):
                    if not self.embeddings.turn(job, job.request):
                        self._wait_again(job)
                        finished = None  # back in the queue: another thread may run it already
                else:
                    self._generate(job)
            except Exception as error:  # noqa: BLE001 - the worker must survive anything; the client hears why
                if self.lanes is None:
                    self._forget_caches()
                job.send(Failed(SpecggufError(f"generation failed: {type(error).__name__}: {error}"), status=500))

    def _wait_again(self, job: Job) -> None:
        """An embedding job whose turn is over goes to the back of the queue (past its limit: it waited already)."""
        with self._changed:
            self._running.discard(job)
            if self._stopping:
                job.send(Failed(SpecggufError("the server is shutting down"), status=503))
            else:
                self._waiting.append(job)
                self._changed.notify()

    def _others_waiting(self) -> bool:
        with self._changed:
            self._drop_cancelled()
            return bool(self._waiting)

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
            job.send(Failed(error, status=503 if isinstance(error, GrammarBusy) else 400))
            return
        if self.lanes is None:
            if plan.deterministic:  # its prompt read whole, in the same passes whatever came before
                for model in (self.verifier, self.draft):
                    if model is not None:
                        model.clear()
            else:
                self.prompts.select(plan.prompt)  # the cached conversation this prompt continues, if one is parked
            self._run(job, plan, self.verifier, self._forget_caches)
            return
        alone = plan.deterministic
        lane = self.lanes.acquire(plan.prompt, fim=request.prompt.fim is not None, fresh=alone)
        try:
            if alone:
                lane.clear()  # its prompt read whole, in the same passes whatever the lane held
            plan = self.planner.on_lane(plan, lane.index, lane.draft)  # its drafter and its policy, the lane's
            with lane.live(alone=alone), self.lanes.shared(plan.policy, lane, alone=alone) as policy:
                self._run(
                    job,
                    replace(plan, policy=policy),
                    lane.verifier,
                    lane.clear,
                    between_steps=lambda: self.lanes.between_steps(lane),  # an editor's completion may go first
                )
        except Exception:
            lane.clear()
            raise
        finally:
            self.lanes.release(lane)

    def _run(self, job: Job, plan: Plan, verifier: Model, forget, *, between_steps=None) -> None:
        """Run a plan on `verifier` (the model's cache, or a lane's sequence) and send what it says;
        `forget` empties the caches it used after a failure inside a model call; `between_steps` (a
        lane's) runs after each step that another follows."""
        request, prompt = plan.request, plan.prompt
        n_cached = reusable(verifier.cached, prompt)
        job.send(Started(n_prompt=len(prompt), n_cached=n_cached))
        wanted_seed = request.sampling.seed
        seed = wanted_seed if wanted_seed is not None and wanted_seed >= 0 else secrets.randbelow(2**31)
        calls, opener, answer = self._answer_text(request)
        logprobs: list[TokenLogprob] = []  # one per generated token, when asked for
        n_logprobs_sent = 0
        marks = DraftMarks(self.verifier.token_bytes) if request.speculation.mark_drafts else None
        drafter = plan.drafter
        if drafter is not None and request.limits.t_max_predict_ms:  # FIM's time budget: no drafts past its line
            drafter = LineEndDrafter(  # (asked from the answer's steps on: `generation` is made by then)
                drafter,
                token_bytes=self.verifier.token_bytes,
                elapsed_ms=lambda: _answer_ms(generation),
                limit_ms=request.limits.t_max_predict_ms,
            )
        generation = self.prepared.generate(
            prompt,
            verifier=verifier,
            drafter=drafter,
            policy=plan.policy,
            max_tokens=request.limits.max_tokens,
            settings=request.sampling.settings,
            seed=seed,
            constraint=plan.constraint,
        )
        try:
            with stops_when(job.cancelled):  # a client that hangs up stops even a prompt's pass
                n_logprobs_sent = self._send_steps(job, generation, calls, answer, marks, logprobs, between_steps)
        except Cancelled:
            pass  # between two chunks of a model call: the caches keep what was evaluated, whole
        except SpecggufError as error:
            forget()
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

    def _send_steps(
        self, job: Job, generation, calls, answer: AnswerText, marks, logprobs: list[TokenLogprob], between_steps
    ) -> int:
        """Send each step's text (and calls) as it comes, until the answer ends or its client has gone;
        `logprobs` gathers the tokens' log-probabilities. How many of them were sent."""
        request = job.request
        assert isinstance(request, GenerationRequest)
        n_top, n_logprobs_sent = request.sampling.n_top_logprobs, 0
        for event in generation:
            tokens, timed_out = self._within_time(request, generation, event.tokens)
            if n_top is not None and tokens and event.target_logits is not None:
                logprobs += token_logprobs(
                    event.target_logits, tokens, n_top=n_top, token_bytes=self.verifier.token_bytes
                )
            fragments = [] if calls is None else calls.feed(tokens)
            text = answer.add(tokens)
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
            if timed_out:
                break  # FIM's time limit: the answer ends at this line's end ("length")
            if between_steps is not None and not event.stop:
                between_steps()
        return n_logprobs_sent

    def _answer_text(self, request: GenerationRequest) -> tuple[CallStream | None, list[str], AnswerText]:
        """The answer's text as it comes (stop strings held back), and its calls (the content ends there)."""
        calls = call_stream(request.tools, self.tool_family, self.verifier.token_bytes)
        opener = [] if calls is None else calls.syntax.openers
        return (
            calls,
            opener,
            AnswerText(self.verifier.token_bytes, request.limits.stops + opener, n_indent=request.limits.n_indent),
        )

    def _within_time(self, request: GenerationRequest, generation, tokens: list[int]) -> tuple[list[int], bool]:
        """A step's tokens up to FIM's time limit (text.time_cut), timed from the first token."""
        elapsed_ms = _answer_ms(generation)
        if not request.limits.t_max_predict_ms or elapsed_ms is None:
            return tokens, False
        return time_cut(
            tokens, self.verifier.token_bytes, elapsed_ms=elapsed_ms, limit_ms=request.limits.t_max_predict_ms
        )


def _answer_ms(generation: Generation) -> float | None:
    """Milliseconds since the answer's first token (None before it)."""
    started = generation.first_token_at
    return None if started is None else (time.perf_counter() - started) * 1000


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
