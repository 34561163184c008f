"""Constrained decoding's side of the algorithm: the `Constraint` protocol (a grammar's state over
token ids). `grammar_walk.GrammarWalk` gives the engine the masks along a draft.

The rule under a grammar (docs/how-it-works.md): both distributions are masked by the same state
and renormalised (`sampling.mask_logits`), at every draft position the state is the one advanced
along the drafted prefix, a draft is cut at its first forbidden token, and the state is committed
only for tokens the verifier accepted. The grammar itself (JSON schemas, GBNF) lives outside
core/ (`specgguf/grammar.py`, over llguidance); tests use small tables (tests/fakes.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Constraint(Protocol):
    """A grammar's state after the tokens it has been told; it only ever moves forward by
    `advance` and back by `rollback` (drafting ahead, then the verifier's verdict)."""

    def allowed(self) -> np.ndarray:
        """Which tokens may come next: a bool mask over the verifier's vocabulary (never all False;
        at the grammar's end, only end-of-generation tokens)."""

    def advance(self, token: int) -> None:
        """Take `token` (one `allowed` said yes to)."""

    def rollback(self, n_tokens: int) -> None:
        """Forget the last `n_tokens` advanced."""

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar would take from here (the state is unchanged)."""

    def forced(self) -> list[int]:
        """Tokens the grammar forces from here (its only continuation), maybe none: free drafts."""
