"""`HybridDrafter`: the n-gram proposal where its match is long and sure, the draft model elsewhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .drafting import Drafter, Drafts, DraftStep, Source
from .ngram_drafter import Match, NgramDrafter
from .rounds import K_MAX


class HybridDrafter:
    """The n-gram proposal when its match is at least `min_match` tokens long and its first draft's
    evidence gives it at least `min_chance` (ngram_drafter.Match.evidence), else the model: a weak
    repeat of the answer's own words is no reason to leave out a draft model that would draft there.
    Each step's `Drafts.source` says which; `kpolicy.PerSource` keeps a K policy for each."""

    source: Source = "model"

    def __init__(self, model_drafter: Drafter, ngram: NgramDrafter, *, min_match: int = 3, min_chance: float = 0.0):
        self.model_drafter, self.ngram = model_drafter, ngram
        self.min_match, self.min_chance = min_match, min_chance
        # A step asks `next_source`, then `propose`, on the same context: one lookup (up to K_MAX
        # tokens, cut to the step's K) serves both. The key: the context's length and last tokens.
        self._last: tuple[tuple[int, ...], int, Match] | None = None  # (key, its k, the match)

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self._last = None
        self.model_drafter.prepare(prompt_tokens)
        self.ngram.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.model_drafter.room(context_length)

    def unread(self, context: list[int]) -> int:
        return self.model_drafter.unread(context)

    def next_source(self, context: list[int]) -> Source:
        return self.ngram.source if self._takes(self._lookup(context, 1)) else self.model_drafter.source

    def _lookup(self, context: list[int], k: int) -> Match:
        key = (len(context), *context[-self.ngram.max_ngram :])
        if self._last is None or self._last[0] != key or self._last[1] < k:
            self._last = (key, max(k, K_MAX), self.ngram.lookup(context, max(k, K_MAX)))
        match = self._last[2]
        return dataclasses.replace(match, tokens=match.tokens[:k])

    def _takes(self, match: Match) -> bool:
        return bool(match.tokens) and match.length >= self.min_match and match.evidence()[0] >= self.min_chance

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        # The same test as `next_source`, on the same lookup.
        match = self._lookup(context, k)
        if self._takes(match):
            return self.ngram.drafts(match, step)
        return self.model_drafter.propose(context, k, step)

    def sync(self, context: list[int]) -> None:
        self.model_drafter.sync(context)
        self.ngram.sync(context)
