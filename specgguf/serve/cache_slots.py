"""Several cached conversations (`--cache-slots N`): the models' KV caches hold one conversation
(the live one); up to N - 1 others are parked as saved llama.cpp sequence state (bytes) for the
verifier and the draft alike. A request whose prompt shares a longer token prefix with a parked
conversation than with the live one swaps them: the live one is parked (the least recently used
parked one evicted when all slots are full), the parked one restored, and the engine then keeps
that prefix as it always does. Slots are keyed on tokens alone: a prompt is always the fresh
tokenization of its request's text (conversation.py), so a follow-up turn shares its conversation's
tokens up to where the earlier answer's generated tokens differ from its text's own.
Only the worker thread touches this (as it alone touches the models)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..core.drafting import common_prefix


@dataclass
class _Parked:
    states: list[tuple[bytes, list[int]]]  # per model: its saved cache and the tokens it holds
    used: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> list[int]:
        return self.states[0][1]  # the verifier's


class CacheSlots:
    def __init__(self, models: list[Any], n_slots: int = 1):
        self.models, self.n_slots = [m for m in models if m is not None], max(1, n_slots)
        self.live_prompt: list[int] = []  # the last prompt the live conversation answered
        self.parked: list[_Parked] = []
        self.n_swaps = 0

    def select(self, prompt: list[int]) -> None:
        """Bring the conversation that shares most of `prompt` into the models' caches; a prompt
        that shares little with any parks the live one (the engine then refills the caches)."""
        if self.n_slots < 2:
            return
        live_match = common_prefix(self.models[0].cached, prompt)
        best = max(self.parked, key=lambda slot: common_prefix(slot.tokens, prompt), default=None)
        if best is None or common_prefix(best.tokens, prompt) <= live_match:
            if not self._continues_live(live_match):
                self._park_live()  # so the new conversation does not overwrite it for good
        else:
            self.parked.remove(best)
            self._park_live()
            for model, (state, tokens) in zip(self.models, best.states):
                model.load_state(state, tokens)
            self.n_swaps += 1
        self.live_prompt = list(prompt)

    def _continues_live(self, live_match: int) -> bool:
        """Whether a prompt sharing `live_match` tokens with the live cache follows up its last request:
        it keeps all of that request's prompt (but its last token: the end of a prompt, a new line,
        may tokenize differently once an answer follows it). Where the earlier answer came out as
        tokens its text does not tokenize to, the follow-up shares less of the answer; that is no
        new conversation."""
        return not self.models[0].cached or live_match >= len(self.live_prompt) - 1

    def _park_live(self) -> None:
        self.parked.append(_Parked([model.save_state() for model in self.models]))
        while len(self.parked) > self.n_slots - 1:
            self.parked.remove(min(self.parked, key=lambda slot: slot.used))

    def forget(self) -> None:
        """After a failure: nothing cached can be trusted."""
        self.live_prompt = []
        self.parked.clear()
