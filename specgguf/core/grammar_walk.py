"""The masks for a step's verify rows under a grammar (`constraint.Constraint`), along the engine's
acceptance walk over the step's `drafting.Drafts`.

Apart from constraint.py, which drafting.py reads (a drafter masks its rows by the constraint), so
that the two import nothing of each other's in a circle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .constraint import Constraint
from .drafting import Drafts


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
            known = self.drafts.masks[node + 1] if node + 1 < len(self.drafts.masks) else None
            self._masks[node] = known if known is not None else self.constraint.allowed()
        return self._masks[node]

    def commit(self, emitted: Sequence[int]) -> None:
        """The verifier's verdict: the step's emitted tokens (its accepted drafts, already advanced
        by the walk, then its own token), up to an end-of-generation token."""
        for token in emitted[self.depth :]:
            self.constraint.advance(token)
        self.depth = len(emitted)
