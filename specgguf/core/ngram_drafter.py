"""`NgramDrafter`: prompt lookup. Proposes what followed the most recent earlier occurrence of
the longest suffix n-gram of the context, or what the session n-gram cache saw; no model at all."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .drafting import Drafts, DraftStep, Source, common_prefix, fixed_drafts
from .ngram_cache import SessionNgrams


class NgramDrafter:
    """Prompt lookup: continue the longest recent n-gram match in prompt + output; with a
    `session` cache (ngram_cache.py), what followed n-grams anywhere in the session where the
    context has no match. It teaches the session everything it reads and sees generated."""

    source: Source = "ngram"

    def __init__(
        self, *, max_ngram: int = 4, min_ngram: int = 2, window: int = 4096, session: SessionNgrams | None = None
    ):
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window
        self.session = session
        self._history: Sequence[int] = []  # the last answer's context (the engine's list), ...
        self._n_learned = 0  # ... learned this far

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        if self.session is not None:
            # A chat's next prompt repeats the conversation so far: only what is new is counted.
            self.session.learn(prompt_tokens, start=common_prefix(self._history[: self._n_learned], prompt_tokens))
            self._history, self._n_learned = prompt_tokens, len(prompt_tokens)

    def learn(self, context: list[int]) -> None:
        """Teach the session the tokens the verifier settled on since the last call."""
        if self.session is not None and len(context) > self._n_learned:
            self.session.learn(context, start=self._n_learned)
            self._history, self._n_learned = context, len(context)

    def room(self, context_length: int) -> int:
        return 1 << 30

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def lookup(self, context: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest suffix n-gram's latest earlier occurrence,
        and that n-gram's length (0: no match)."""
        history = np.asarray(context[-self.window :], dtype=np.int64)
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            pattern = history[-n:]
            # Windows that start early enough to have at least one token after them.
            windows = sliding_window_view(history[:-1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            hits = hits[hits + n < len(history)]
            if hits.size:
                start = int(hits[-1]) + n  # the most recent occurrence
                return history[start : start + k].tolist(), n
        return self.session.lookup(context, k) if self.session is not None else ([], 0)

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        return self.drafts(self.lookup(context, k)[0] if k > 0 else [], step)

    def drafts(self, tokens: list[int], step: DraftStep) -> Drafts:
        """Deterministic proposals: when sampling, each a one-hot draft distribution."""
        return fixed_drafts(tokens, step, self.source)

    def sync(self, context: list[int]) -> None:
        self.learn(context)
