"""`ForcedDrafter`: under a grammar, the tokens it forces are the step's drafts (source "grammar"):
they cost no draft model and the verifier, masked by the same grammar, nearly always accepts them.
Anywhere else the wrapped drafter proposes, its drafts masked by the grammar (`DraftStep.constraint`).

A forced token is still a draft checked by the acceptance rule (a one-hot draft distribution), so
the output law is the masked verifier's even where the grammar's "forced" tokenization is not the
only one its mask allows."""

from __future__ import annotations

from collections.abc import Sequence

from .constraint import Constraint
from .drafting import Drafter, Drafts, DraftStep, Source, fixed_drafts


class ForcedDrafter:
    source: Source = "grammar"

    def __init__(self, inner: Drafter, constraint: Constraint):
        self.inner, self.constraint = inner, constraint

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self.inner.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.inner.room(context_length)

    def next_source(self, context: list[int]) -> Source:
        return self.source if self.constraint.forced() else self.inner.next_source(context)

    def unread(self, context: list[int]) -> int:
        return self.inner.unread(context)

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        forced = self.constraint.forced()[:k]
        if not forced:
            return self.inner.propose(context, k, step)
        return fixed_drafts(forced, step, self.source)

    def sync(self, context: list[int]) -> None:
        self.inner.sync(context)
