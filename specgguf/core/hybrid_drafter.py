"""`HybridDrafter`: the n-gram proposal where its match is long, the draft model elsewhere."""

from __future__ import annotations

from collections.abc import Sequence

from .drafting import Drafter, Drafts, DraftStep, Source
from .ngram_drafter import NgramDrafter


class HybridDrafter:
    """The n-gram proposal when its match is at least `min_match` tokens long, else the model.
    Each step's `Drafts.source` says which; `kpolicy.PerSource` keeps a K policy for each."""

    source: Source = "model"

    def __init__(self, model_drafter: Drafter, ngram: NgramDrafter, *, min_match: int = 3):
        self.model_drafter, self.ngram, self.min_match = model_drafter, ngram, min_match

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self.model_drafter.prepare(prompt_tokens)
        self.ngram.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.model_drafter.room(context_length)

    def next_source(self, context: list[int]) -> Source:
        match = self.ngram.lookup(context, 1)
        return self.ngram.source if match.tokens and match.length >= self.min_match else self.model_drafter.source

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        # The same test as `next_source`, on the lookup the proposal needs anyway.
        match = self.ngram.lookup(context, k)
        if match.tokens and match.length >= self.min_match:
            return self.ngram.drafts(match, step)
        return self.model_drafter.propose(context, k, step)

    def sync(self, context: list[int]) -> None:
        self.model_drafter.sync(context)
        self.ngram.sync(context)
