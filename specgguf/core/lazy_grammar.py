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


class CallGrammar(Constraint, Protocol):
    @property
    def accepting(self) -> bool:
        """The call is complete."""


class LazyGrammar:
    """`mode` "free": any token (the opener starts a call; `call` None: the opener is forbidden, for
    tool_choice "none"); "open": the opener must come now (tool_choice "required" or a named
    function; an `opener` of None starts inside the call); "call": the call's grammar; "between":
    after a call, an end token, or (parallel) `between` tokens (whitespace) and the opener."""

    def __init__(
        self,
        *,
        n_vocab: int,
        opener: int | None,
        call: Callable[[], CallGrammar] | None,
        end: np.ndarray,
        between: np.ndarray,
        required: bool,
        parallel: bool,
    ):
        self.n_vocab, self.opener, self.new_call, self.parallel = n_vocab, opener, call, parallel
        self._end, self._between = end, between | end
        if opener is not None:
            self._between = self._between.copy()
            self._between[opener] = parallel
        self._free = np.ones(n_vocab, dtype=bool)
        if opener is not None and call is None:
            self._free[opener] = False
        self.calls: list[CallGrammar] = []
        self.mode: Mode = "free" if not required else "open"
        if required and opener is None:
            self._start_call()
        self._log: list[tuple[Mode, int]] = []  # per token advanced: the mode before it, the calls before it

    def _start_call(self) -> None:
        assert self.new_call is not None
        self.calls.append(self.new_call())
        self.mode = "call"

    def allowed(self) -> np.ndarray:
        if self.mode == "free":
            return self._free
        if self.mode == "open":
            mask = np.zeros(self.n_vocab, dtype=bool)
            mask[self.opener] = True
            return mask
        if self.mode == "call":
            return self.calls[-1].allowed()
        return self._between if self.mode == "between" else self._end

    def advance(self, token: int) -> None:
        self._log.append((self.mode, len(self.calls)))
        if self.mode == "call":
            self.calls[-1].advance(token)
            if self.calls[-1].accepting:
                self.mode = "between"
        elif self.mode in ("free", "open", "between") and token == self.opener and self.new_call is not None:
            self._start_call()
        elif self.mode == "between" and self._end[token]:
            self.mode = "done"

    def rollback(self, n_tokens: int) -> None:
        for _ in range(n_tokens):
            mode, n_calls = self._log.pop()
            if mode == "call":
                self.calls[-1].rollback(1)
            del self.calls[n_calls:]
            self.mode = mode

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
        if self.mode == "open" and self.opener is not None:
            return [self.opener]
        return self.calls[-1].forced() if self.mode == "call" else []
