"""`NgramDrafter`: prompt lookup. Proposes what followed the most recent earlier occurrence of
the longest suffix n-gram of the context, or what the session n-gram cache saw; no model at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .drafting import Drafts, DraftStep, Source, fixed_drafts
from .ngram_cache import SessionNgrams

# The chance a prompt-lookup draft is right, given the drafts before it were, by the length of the
# match it continues (index; the last stands for longer ones) and where that match's continuation is:
# draft j (0-based) of a proposal continues a match of n + j tokens. Measured by replaying prompt
# lookup over the verifier's greedy answers to the 26 prompts of the benchmark suite
# (scripts/ngram_evidence.py; docs/adaptive-k.md has the table): a copy from the prompt (an edit,
# a summary) is right far more often than a repeat of the answer's own words. Where earlier
# occurrences of the match went on differently, the first draft was right 3 times in 64: DISAGREED.
# (Length 1, below the default min_ngram, is a guess.) Only priors: the policy learns how often
# drafts of each are right here (kpolicy's calibration bins).
PROMPT_PRIORS = (0.0, 0.4, 0.55, 0.72, 0.82, 0.84, 0.86, 0.88, 0.92)
ANSWER_PRIORS = (0.0, 0.25, 0.38, 0.48, 0.68, 0.72, 0.74, 0.76, 0.78)
DISAGREED = 0.05


@dataclass(frozen=True)
class Match:
    """A lookup's proposal and its evidence: the match's length, whether what it proposes is a copy of
    the prompt (else of the answer so far, or of the session's earlier texts), and whether every earlier
    occurrence of the match went on with the same token."""

    tokens: list[int] = field(default_factory=list)
    length: int = 0  # 0: no match
    in_prompt: bool = False
    agreed: bool = True

    def evidence(self) -> list[float]:
        """Each draft's prior chance of being right, given the drafts before it were."""
        priors = PROMPT_PRIORS if self.in_prompt else ANSWER_PRIORS
        chances = [priors[min(self.length + j, len(priors) - 1)] for j in range(len(self.tokens))]
        if chances and not self.agreed:
            chances[0] = DISAGREED
        return chances


class NgramDrafter:
    """Prompt lookup: continue the longest recent n-gram match in prompt + output; with a
    `session` cache (ngram_cache.py), what followed n-grams anywhere in the session where the
    context has no match. It teaches the session everything it reads and sees generated."""

    source: Source = "ngram"

    def __init__(
        self, *, max_ngram: int = 8, min_ngram: int = 2, window: int = 4096, session: SessionNgrams | None = None
    ):
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window
        self.session = session
        self._n_learned = 0  # of the answer's context (the engine's list): learned this far
        self._n_prompt = 0  # the answer's prompt: a match's continuation before this is a copy of it

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self._n_prompt = len(prompt_tokens)
        if self.session is not None:
            # A chat's next prompt repeats the conversation so far: only what is new is counted.
            self.session.learn(prompt_tokens, start=self.session.learned_prefix(prompt_tokens))
            self._n_learned = len(prompt_tokens)

    def learn(self, context: list[int]) -> None:
        """Teach the session the tokens the verifier settled on since the last call."""
        if self.session is not None and len(context) > self._n_learned:
            self.session.learn(context, start=self._n_learned)
            self._n_learned = len(context)

    def room(self, context_length: int) -> int:
        return 1 << 30

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def unread(self, context: list[int]) -> int:
        return 0  # a lookup reads nothing first

    def lookup(self, context: list[int], k: int) -> Match:
        """Up to k tokens that followed the longest suffix n-gram's latest earlier occurrence, with the
        evidence for them (no tokens, length 0: no match)."""
        history = np.asarray(context[-self.window :], dtype=np.int64)
        m, last = self.min_ngram, len(history) - 1
        if last >= m:
            # Earlier occurrences of the last m tokens (each with a token after it), by where they end ...
            ends = np.flatnonzero((sliding_window_view(history[:-1], m) == history[-m:]).all(axis=1)) + m - 1
            if ends.size:
                # ... each grown backwards while it still matches, up to max_ngram (and the history before).
                lengths, alive = np.full(ends.size, m), np.ones(ends.size, dtype=bool)
                for j in range(m, min(self.max_ngram, last)):
                    alive &= (ends >= j) & (history[np.maximum(ends - j, 0)] == history[last - j])
                    lengths += alive
                n = int(lengths.max())
                followers = history[ends[lengths == n] + 1]
                start = int(ends[lengths == n][-1]) + 1  # the most recent of the longest
                return Match(
                    tokens=history[start : start + k].tolist(),
                    length=n,
                    in_prompt=len(context) - len(history) + start < self._n_prompt,
                    agreed=bool((followers == followers[-1]).all()),
                )
        if self.session is None:
            return Match()
        tokens, n = self.session.lookup(context, k)
        return Match(tokens, n)

    def guess(self, context: list[int], k: int) -> tuple[list[int], list[float]]:
        """`lookup`'s tokens and evidence, for a draft model to read ahead (drafting.Guess)."""
        match = self.lookup(context, k)
        return match.tokens, match.evidence()

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        return self.drafts(self.lookup(context, k), step) if k > 0 else Drafts(source=self.source)

    def drafts(self, match: Match, step: DraftStep) -> Drafts:
        """Deterministic proposals (when sampling, each a one-hot draft distribution), as many as the
        policy finds worth verifying by their evidence (`step.worth`), each with its prior chance."""
        evidence = match.evidence()
        n = step.worth(evidence) if step.worth is not None else len(evidence)
        drafts = fixed_drafts(match.tokens[:n], step, self.source)
        drafts.confidence = evidence[:n]
        return drafts

    def sync(self, context: list[int]) -> None:
        self.learn(context)
