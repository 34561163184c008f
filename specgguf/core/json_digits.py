"""JSON numbers' digits bounded over a constraint: a model that starts `"mass": 0.333…` cannot write
digits until max_tokens.

llguidance's JSON schemas bound a number only by its value (`minimum`, `maximum`), and a bounded
number then loses its exponent, so the bound is kept here, over the grammar's own masks: `DigitBound`
reads the text its tokens make as JSON's lexer does (in a string or not; a number's integral part,
fraction, exponent) and masks a token that would take a part past its bound. Within the bounds the
mask is the grammar's, so the law of the numbers a model writes within them is the model's own
(tests/test_number_bounds.py counts it). llama.cpp's schema converter bounds each part at 16 digits;
the fraction here at 24, so that every double as Python or JavaScript prints it passes (at most 17
significant digits after at most 6 zeros: `0.30000000000000004`, `1.2345678901234567e-07`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .constraint import Constraint

# Where the text is: outside a string and a number, in a string (after a backslash), in a number's
# integral part, after its point, in its fraction, after its e (and sign), in its exponent.
OUT, STRING, ESCAPE, INTEGRAL, POINT, FRACTION, E, EXPONENT = range(8)
DIGITS = frozenset(b"0123456789")


@dataclass(frozen=True)
class Bounds:
    integral: int | None = 16  # None: unbounded (a schema that allows wider integers: its bound stands)
    fraction: int = 24
    exponent: int = 16

    def of(self, part: int) -> int | None:
        return {INTEGRAL: self.integral, FRACTION: self.fraction, EXPONENT: self.exponent}.get(part)


def step(state: tuple[int, int], byte: int) -> tuple[int, int]:
    """The lexer's state (where, digits in this part) after one more byte."""
    where, count = state
    if where == STRING:
        return (ESCAPE if byte == 0x5C else OUT if byte == 0x22 else STRING), 0
    if where == ESCAPE:
        return STRING, 0  # \uXXXX's hex digits are the string's
    if byte in DIGITS:
        if where in (INTEGRAL, FRACTION, EXPONENT):
            return where, count + 1
        return {POINT: FRACTION, E: EXPONENT}.get(where, INTEGRAL), 1
    if byte == 0x2E and where == INTEGRAL:
        return POINT, 0
    if byte in b"eE" and where in (INTEGRAL, FRACTION):
        return E, 0
    if byte in b"+-" and where == E:
        return E, 0
    return (STRING if byte == 0x22 else OUT), 0


_LEADS: dict[int, tuple[Sequence[bytes], np.ndarray]] = {}  # by the vocabulary's id (kept alive here)


def leading_digits(token_bytes: Sequence[bytes]) -> np.ndarray:
    """Each token's leading digits: what it adds to the part it continues (once per vocabulary)."""
    if (known := _LEADS.get(id(token_bytes))) is None or known[0] is not token_bytes:
        lead = [len(text) - len(text.lstrip(b"0123456789")) for text in token_bytes]
        if len(_LEADS) >= 4:
            _LEADS.clear()
        known = _LEADS[id(token_bytes)] = (token_bytes, np.array(lead, dtype=np.int32))
    return known[1]


class DigitBound:
    """`inner` (a JSON grammar's constraint) with each number's parts bounded in digits."""

    def __init__(self, inner: Constraint, token_bytes: Sequence[bytes], bounds: Bounds = Bounds()):
        self.inner, self.token_bytes, self.bounds = inner, token_bytes, bounds
        self._lead = leading_digits(token_bytes)
        self._most = int(self._lead.max(initial=0))
        self._states: list[tuple[int, int]] = [(OUT, 0)]  # one per token advanced, after it

    def _after(self, state: tuple[int, int], token: int, *, check: bool = True) -> tuple[int, int] | None:
        """The state after `token`, or None where it takes a part past its bound (`check`)."""
        for byte in self.token_bytes[token] if token < len(self.token_bytes) else b"":
            state = step(state, byte)
            bound = self.bounds.of(state[0])
            if check and bound is not None and state[1] > bound:
                return None
        return state

    def allowed(self) -> np.ndarray:
        mask = self.inner.allowed()
        where, count = self._states[-1]
        part = {POINT: FRACTION, E: EXPONENT}.get(where, where)
        bound = self.bounds.of(part)
        if bound is None or count + self._most <= bound:
            return mask
        blocked = np.zeros(len(mask), dtype=bool)
        n = min(len(mask), len(self._lead))
        blocked[:n] = self._lead[:n] > bound - count
        bounded = mask & ~blocked
        # Where the grammar allows nothing else (a schema whose own bound asks for more digits), it stands.
        return bounded if bounded.any() else mask

    def advance(self, token: int) -> None:
        self.inner.advance(token)
        state = self._after(self._states[-1], token, check=False)  # (past a bound only where the grammar asked)
        assert state is not None
        self._states.append(state)

    def rollback(self, n_tokens: int) -> None:
        self.inner.rollback(n_tokens)
        del self._states[len(self._states) - n_tokens :]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        n_valid, state = self.inner.valid_prefix(tokens), self._states[-1]
        for index, token in enumerate(tokens[:n_valid]):
            after = self._after(state, token)
            if after is None:
                return index
            state = after
        return n_valid

    def forced(self) -> list[int]:
        forced = list(self.inner.forced())
        return forced[: self.valid_prefix(forced)]

    @property
    def accepting(self) -> bool:
        return bool(getattr(self.inner, "accepting", False))
