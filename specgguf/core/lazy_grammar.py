"""`LazyGrammar`: a grammar that starts only where the model opens one (tool calls, as llama-server's
lazy grammars): free text until the opener token, then one call's grammar (a fresh one per call),
then the end or, with parallel calls, another opener. A `Constraint` itself, so the engine's exact
rule (constraint.py) and free forced-token drafts apply inside the calls unchanged."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import numpy as np

from .constraint import Constraint

Mode = Literal["free", "open", "call", "between", "done"]
State = tuple[Mode, int, int]  # the mode, how many calls began, and `progress`
MAX_BETWEEN = 4  # whitespace tokens after a call before the end or the next call: no loop of newlines


class CallGrammar(Constraint, Protocol):
    @property
    def accepting(self) -> bool:
        """The call is complete."""


class LazyGrammar:
    """`mode` "free": any token; the tokens of one of `openers` start that opener's call grammar.
    "open": the first opener's tokens must come now (tool_choice "required" or a named function, and
    after "between" once its first token came; no openers: the answer starts inside a call). "call":
    the call's grammar. "between": after a call, an end token, or (parallel) the first opener again,
    after up to MAX_BETWEEN `between` tokens (whitespace)."""

    def __init__(
        self,
        *,
        n_vocab: int,
        openers: Sequence[Sequence[int]],
        calls: Sequence[Callable[[], CallGrammar]],
        end: np.ndarray,
        between: np.ndarray,
        required: bool,
        parallel: bool,
    ):
        self.n_vocab = n_vocab
        self.openers = [tuple(opener) for opener in openers]
        self.new_calls = list(calls)
        self._end, self._after_call = end, end.copy()
        if self.openers:
            self._after_call[self.openers[0][0]] = parallel
        self._between = between | self._after_call
        self._free = np.ones(n_vocab, dtype=bool)
        self.calls: list[CallGrammar] = []
        self.tokens: list[int] = []
        self.mode: Mode = "free" if not required else "open"
        self.progress = 0  # in "open": the first opener's tokens so far; in "between": whitespace tokens
        if required and not self.openers:
            self._start_call(0)
        self._log: list[State] = []  # per token advanced: the state before it

    def _start_call(self, which: int) -> None:
        self.calls.append(self.new_calls[which]())
        self.mode, self.progress = "call", 0

    def allowed(self) -> np.ndarray:
        if self.mode == "free":
            return self._free
        if self.mode == "call":
            return self.calls[-1].allowed()
        if self.mode == "between":
            return self._between if self.progress < MAX_BETWEEN else self._after_call
        if self.mode == "done":
            return self._end
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[self.openers[0][self.progress]] = True
        return mask

    def advance(self, token: int) -> None:
        self._log.append((self.mode, len(self.calls), self.progress))
        self.tokens.append(token)
        if self.mode == "call":
            self.calls[-1].advance(token)
            if self.calls[-1].accepting:
                self.mode, self.progress = "between", 0
        elif self.mode == "free":
            for which, opener in enumerate(self.openers):
                n = len(opener)
                if tuple(self.tokens[-n:]) == opener and all(state[0] == "free" for state in self._log[-n:]):
                    self._start_call(which)
                    break
        elif self.mode == "between" and self.openers and token == self.openers[0][0]:
            self.mode, self.progress = "open", 0
            self._opener_token()
        elif self.mode == "between" and self._end[token]:
            self.mode = "done"
        elif self.mode == "between":
            self.progress += 1
        elif self.mode == "open":
            self._opener_token()

    def _opener_token(self) -> None:
        self.progress += 1
        if self.progress == len(self.openers[0]):
            self._start_call(0)

    def rollback(self, n_tokens: int) -> None:
        for _ in range(n_tokens):
            self.mode, n_calls, self.progress = self._log.pop()
            self.tokens.pop()
            if self.mode == "call":
                self.calls[-1].rollback(1)
            del self.calls[n_calls:]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        try:
            for token in tokens:
                if self.mode == "call":
                    if self.calls[-1].valid_prefix([token]) < 1:
                        break
                elif not self.allowed()[token]:
                    break
                self.advance(token)
                n += 1
        finally:
            self.rollback(n)
        return n

    def forced(self) -> list[int]:
        if self.mode == "open":
            return list(self.openers[0][self.progress :])
        return self.calls[-1].forced() if self.mode == "call" else []
