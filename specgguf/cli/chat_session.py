"""A chat conversation: each turn's prompt is the whole conversation's text, tokenized fresh.

A turn's prompt is what a server sent the same messages would read: the chat template
rendered over every question and answer (as text), tokenized as one
(conversation.Prompts.history). The engine keeps whatever token prefix of it each model's
KV cache already holds, so a turn evaluates only its new tokens: the new question, the
template around it, and the earlier answer from where its generated tokens differ from
what its text tokenizes to (usually nowhere: a model mostly generates its tokenizer's own
split).

The terminal side (reading lines, slash commands, Ctrl-C) is in `chat` (`ChatRepl`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..conversation import Prompts
from ..core.drafting import Drafter, common_prefix, reusable
from ..core.engine import KPolicy, StepEvent, speculate
from ..core.events import Generation, GenerationStats
from ..core.sampling import SamplingSettings
from ..errors import ContextFullError, PromptError
from ..llama.loaded import LoadedModel


@dataclass
class Turn:
    question: str
    answer_tokens: list[int] = field(default_factory=list)
    answer: str = ""
    stop: str | None = None  # "eos", "max_tokens", "context" or "interrupted"
    stats: GenerationStats = field(default_factory=GenerationStats)
    n_prompt: int = 0  # tokens in this turn's prompt (the whole conversation so far)
    n_evaluated: dict[str, int] = field(default_factory=dict)  # of those, what each model evaluated (not cached)
    first_token_seconds: float | None = None  # from the question to its first answer token


class ChatSession:
    """The conversation and both models' caches; `ask` starts an answer, `Reply.finish` records it."""

    def __init__(
        self,
        *,
        verifier: LoadedModel,
        draft: LoadedModel | None = None,
        drafter: Drafter | None = None,
        policy: KPolicy,
        k_source: str = "",
        system: str | None = None,
        max_tokens: int,
        settings: SamplingSettings,
        seed: int,
    ):
        self.verifier = verifier
        self.draft = draft  # the draft model, if `drafter` uses one: for its cache accounting
        self.drafter, self.policy, self.k_source = drafter, policy, k_source
        self.system = system or None
        self.max_tokens, self.settings, self.seed = max_tokens, settings, seed
        self.rng = np.random.default_rng(seed)
        self.prompts = Prompts(verifier)
        self.reset()

    @property
    def drafting(self) -> bool:
        """False at a fixed K of 0: then the draft model sits out (and catches up if K rises)."""
        return self.drafter is not None and (self.policy.adapts or self.policy.drafts("model"))

    def reset(self) -> None:
        """Forget the conversation (not the system prompt) and the totals. The caches stay:
        the next prompt reuses what still matches (the system prompt)."""
        self.transcript: list[Turn] = []  # every turn since the start or /reset
        self.first_in_context = 0  # turns before this one were dropped to make room
        self.totals = GenerationStats()

    @property
    def in_context(self) -> list[Turn]:
        return self.transcript[self.first_in_context :]

    @property
    def n_ctx(self) -> int:
        return self.verifier.n_ctx

    @property
    def has_template(self) -> bool:
        return self.prompts.has_template

    def conversation_tokens(self, turns: list[Turn], question: str) -> list[int]:
        """The prompt for `question` after `turns` (conversation.Prompts.history)."""
        return self.prompts.history(self.system, [(t.question, t.answer) for t in turns], question)

    def _fit(self, question: str) -> tuple[list[int], int]:
        """The prompt, dropping the fewest oldest turns that leave room for an answer."""
        room_for_answer = min(self.max_tokens, self.n_ctx // 4)
        turns = self.in_context
        for n_dropped in range(len(turns) + 1):
            tokens = self.conversation_tokens(turns[n_dropped:], question)
            if len(tokens) + room_for_answer <= self.n_ctx:
                return tokens, n_dropped
        if len(tokens) < self.n_ctx:  # no room for a whole answer, but it can start
            return tokens, len(turns)
        raise ContextFullError(
            f"this message takes {len(tokens)} tokens with the chat template, but the"
            f" context holds {self.n_ctx}; shorten it or raise -c/--ctx-size"
        )

    def ask(self, question: str) -> Reply:
        start = time.perf_counter()
        if not question.strip():
            raise PromptError("the message is empty")
        tokens, n_dropped = self._fit(question)
        self.first_in_context += n_dropped
        return Reply(self, Turn(question, n_prompt=len(tokens)), tokens, n_dropped=n_dropped, start=start)

    def forget_caches(self) -> None:
        """Empty both KV caches. Needed after an interrupt inside a model call, when a cache may
        hold tokens its `cached` list does not; the next turn evaluates the whole history again."""
        for model in (self.verifier, self.draft):
            if model is not None:
                model.clear()

    def _decode(self, tokens: list[int]) -> str:
        return b"".join(self.verifier.token_bytes(token) for token in tokens).decode("utf-8", errors="replace")

    def _record(self, turn: Turn) -> None:
        turn.answer = self._decode(turn.answer_tokens)
        self.transcript.append(turn)
        self.totals.wall_seconds += turn.stats.wall_seconds


class Reply:
    """One answer in progress: iterate it for the engine's step events, then call `finish`."""

    def __init__(self, session: ChatSession, turn: Turn, prompt_tokens: list[int], *, n_dropped: int, start: float):
        self.session, self.turn, self.prompt_tokens = session, turn, prompt_tokens
        self.n_dropped = n_dropped
        self._start = start
        self._generation: Generation | None = None
        # Of the prompt, what each model's cache held before the answer (`finish` reports what it read).
        self._kept: list[tuple[str, LoadedModel, int]] = []
        self._events = self._generate()

    def __iter__(self) -> Iterator[StepEvent]:
        return self._events

    def _generate(self) -> Generator[StepEvent, None, None]:
        session, turn, prompt = self.session, self.turn, self.prompt_tokens
        drafter = session.drafter if session.drafting else None
        for name, model in (("verifier", session.verifier), ("draft", session.draft if drafter else None)):
            if model is not None:  # what the engine's ingest keeps; the rest, the last token too, is new
                self._kept.append((name, model, reusable(model.cached, prompt)))
        self._generation = Generation(
            speculate(
                verifier=session.verifier,
                drafter=drafter,
                prompt_tokens=prompt,
                k=session.policy,
                max_tokens=session.max_tokens,
                settings=session.settings,
                rng=session.rng,
            ),
            turn.stats,
        )
        for event in self._generation:
            if event.tokens and turn.first_token_seconds is None:
                turn.first_token_seconds = time.perf_counter() - self._start
            turn.answer_tokens += event.tokens
            session.totals.add(event)
            turn.stop = event.stop or turn.stop
            yield event

    def finish(self, *, interrupted: bool = False) -> Turn:
        """Record the answer (a partial one too) in the conversation; the next turn builds on it."""
        self._events.close()
        if self._generation is not None:
            self._generation.close()  # stamps the turn's generation time
        turn = self.turn
        for name, model, kept in self._kept:
            # What it really read of the prompt: a draft model may leave a long prompt unread for all of a
            # short answer (core/drafting.py), and an interrupted prompt's pass may read part of it.
            held = min(len(self.prompt_tokens), common_prefix(model.cached, self.prompt_tokens))
            turn.n_evaluated[name] = max(0, held - kept)
        if interrupted:
            turn.stop = "interrupted"
        self.session._record(turn)
        return turn
