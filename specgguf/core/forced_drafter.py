"""`ForcedDrafter`: under a grammar, the tokens it forces are the step's drafts (source "grammar"):
they cost no draft model and the verifier, masked by the same grammar, nearly always accepts them.
Anywhere else the wrapped drafter proposes, its drafts masked by the grammar (`DraftStep.constraint`),
and what the grammar forces after them follows as free drafts (`drafting.add_forced`: a draft model
takes them inside its chain, a prompt-lookup draft here at its end).

A forced token is still a draft checked by the acceptance rule (a one-hot draft distribution), so
the output law is the masked verifier's even where the grammar's "forced" tokenization is not the
only one its mask allows."""

from __future__ import annotations

from .constraint import Constraint
from .drafting import WHOLE_DRAFTS, Drafter, Drafts, DraftStep, Source, Wrapper, add_forced, fixed_drafts


class ForcedDrafter(Wrapper):
    source: Source = "grammar"

    def __init__(self, inner: Drafter, constraint: Constraint):
        super().__init__(inner)
        self.constraint = constraint

    def next_source(self, context: list[int]) -> Source:
        return self.source if self.constraint.forced() else self.inner.next_source(context)

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        forced = self.constraint.forced()[:k]
        if forced:
            return fixed_drafts(forced, step, self.source)
        drafts = self.inner.propose(context, k, step)
        if drafts.source in WHOLE_DRAFTS and drafts.tokens and not drafts.parents:
            self._then_forced(drafts, k, step)
        return drafts

    def _then_forced(self, drafts: Drafts, k: int, step: DraftStep) -> None:
        """After a prompt-lookup draft (a draft model takes them in its chain), what the grammar forces
        from its end: free drafts as sure as the draft before them, as many as the policy finds worth
        their rows (its prior chances, then 1 each)."""
        n = self.constraint.valid_prefix(drafts.tokens)
        drafts.cut(n)
        for token in drafts.tokens:
            self.constraint.advance(token)
        try:
            room = len(self.constraint.forced()[: k - n])
            if step.worth is not None and room:
                room = step.worth(drafts.confidence + [1.0] * room) - n
            add_forced(drafts, step, room=room)
            drafts.parents = []  # still a chain
        finally:
            self.constraint.rollback(len(drafts.tokens))
