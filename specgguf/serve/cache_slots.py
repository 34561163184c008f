"""Several cached conversations (`--cache-slots N`): the models' KV caches hold one conversation
(the live one); up to N - 1 others are parked as saved llama.cpp sequence state (bytes) for the
verifier and the draft alike. A request whose prompt shares a longer token prefix with a parked
conversation than with the live one swaps them: the live one is parked (the least recently used
parked one evicted when all slots are full), the parked one restored, and the engine then keeps
that prefix as it always does. Each slot also keeps its text -> tokens memory
(`conversation.PromptCache`), so a follow-up turn repeats the answer as the very tokens generated.
Only the worker thread touches this (as it alone touches the models)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..conversation import PromptCache, Prompts
from ..core.drafting import common_prefix


@dataclass
class _Parked:
    memory: PromptCache
    states: list[tuple[bytes, list[int]]]  # per model: its saved cache and the tokens it holds
    used: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> list[int]:
        return self.states[0][1]  # the verifier's


class CacheSlots:
    def __init__(self, prompts: Prompts, models: list[Any], n_slots: int = 1):
        self.prompts, self.models, self.n_slots = prompts, [m for m in models if m is not None], max(1, n_slots)
        self.live = PromptCache(prompts)
        self.parked: list[_Parked] = []
        self.n_swaps = 0

    def tokens_for(self, text: str, *, special: bool) -> list[int]:
        """The prompt's tokens, reusing the longest remembered conversation this text extends."""
        best = max(
            (
                memory
                for memory in [self.live, *(slot.memory for slot in self.parked)]
                if _extends(memory, text, special)
            ),
            key=lambda memory: len(memory.text),
            default=self.live,
        )
        return best.tokens_for(text, special=special)

    def select(self, prompt: list[int]) -> None:
        """Bring the conversation that shares most of `prompt` into the models' caches; a prompt
        that shares little with any parks the live one (the engine then refills the caches)."""
        if self.n_slots < 2:
            return
        live_match = common_prefix(self.models[0].cached, prompt)
        best = max(self.parked, key=lambda slot: common_prefix(slot.tokens, prompt), default=None)
        if best is None or common_prefix(best.tokens, prompt) <= live_match:
            self._start_new(live_match)
            return
        self.parked.remove(best)
        self._park_live()
        for model, (state, tokens) in zip(self.models, best.states):
            model.load_state(state, tokens)
        self.live = best.memory
        self.n_swaps += 1

    def _start_new(self, live_match: int) -> None:
        """A request that does not continue the live conversation: park that one, so the new one
        does not overwrite it for good. (A follow-up repeats the remembered tokens, all of them but
        the newest, which the cache never holds.)"""
        remembered = self.live.tokens or self.models[0].cached
        if not self.models[0].cached or live_match >= len(remembered) - 1:
            return  # nothing to keep, or it continues the live conversation
        self._park_live()
        self.live = PromptCache(self.prompts)
        self.live = PromptCache(self.prompts)

    def _park_live(self) -> None:
        self.parked.append(_Parked(self.live, [model.save_state() for model in self.models]))
        while len(self.parked) > self.n_slots - 1:
            self.parked.remove(min(self.parked, key=lambda slot: slot.used))

    def remember(self, text: str, tokens: list[int], *, special: bool) -> None:
        self.live.remember(text, tokens, special=special)

    def forget_live(self) -> None:
        """After a prompt no text stands for (FIM, token ids): the live conversation's text memory
        goes (the caches still reuse their common token prefix); the parked ones stay."""
        self.live.forget()

    def forget(self) -> None:
        """After a failure: nothing cached can be trusted."""
        self.live.forget()
        self.parked.clear()


def _extends(memory: PromptCache, text: str, special: bool) -> bool:
    return bool(memory.text) and memory.special == special and text.startswith(memory.text)
