"""Constrained decoding's side of the algorithm: the `Constraint` protocol (a grammar's state over
token ids) and `GrammarWalk`, which gives the engine the masks along a draft.

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

from .drafting import Drafts


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


class GrammarWalk:
    """The masks for a step's verify rows, computed lazily along the acceptance walk: row -1 scores
    what follows the context, row i what follows draft i. The walk asks for row i only after
    accepting draft i, so advancing the constraint to it commits an accepted token; masks the
    drafter already computed (`Drafts.masks`, the same states) are reused."""

    def __init__(self, constraint: Constraint, drafts: Drafts):
        self.constraint, self.drafts = constraint, drafts
        self.depth = 0  # drafts advanced (accepted) so far
        self._masks: dict[int, np.ndarray] = {}

    def mask(self, node: int) -> np.ndarray:
        if node not in self._masks:
            if node + 1 != self.depth:  # the walk goes down the chain, one accepted draft at a time
                for token in self.drafts.tokens[self.depth : node + 1]:
                    self.constraint.advance(token)
                self.depth = node + 1
            known = self.drafts.masks
            self._masks[node] = known[node + 1] if node + 1 < len(known) else self.constraint.allowed()
        return self._masks[node]

    def commit(self, emitted: Sequence[int]) -> None:
        """The verifier's verdict: the step's emitted tokens (its accepted drafts, already advanced
        by the walk, then its own token), up to an end-of-generation token."""
        for token in emitted[self.depth :]:
            self.constraint.advance(token)
        self.depth = len(emitted)
