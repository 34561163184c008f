"""Token distributions and the speculative acceptance rule, in pure numpy.

Nothing here does I/O or keeps global state: every random choice takes the
`numpy.random.Generator` it should use, so tests can replay any run.

The processed distribution follows llama.cpp's default sampler chain
(`common/sampling.cpp`): top-k, then top-p and min-p on the *untempered*
logits, then temperature, then a draw from the softmax. Temperature <= 0 is
greedy decoding: the argmax of the raw logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingSettings:
    """The knobs of llama.cpp's sampler chain, with llama.cpp's defaults."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def __post_init__(self) -> None:
        for name, value in (("temperature", self.temperature), ("top-p", self.top_p), ("min-p", self.min_p)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def sparse_distribution(logits: np.ndarray, settings: SamplingSettings) -> tuple[np.ndarray, np.ndarray]:
    """One logits row -> (token ids, their probabilities): the support of the processed
    distribution, which the chain keeps small (top-k), so draws need not scan the vocabulary."""
    n_vocab = logits.shape[0]
    # top-k: keep the k largest logits (0 disables).
    if 0 < settings.top_k < n_vocab:
        candidates = np.argpartition(logits, n_vocab - settings.top_k)[n_vocab - settings.top_k :]
    else:
        candidates = np.arange(n_vocab)
    candidate_logits = logits[candidates].astype(np.float64)
    order = np.argsort(-candidate_logits, kind="stable")
    candidates, candidate_logits = candidates[order], candidate_logits[order]
    # Masked entries (-inf, e.g. draft tokens the verifier does not have) never survive.
    finite = np.isfinite(candidate_logits)
    candidates, candidate_logits = candidates[finite], candidate_logits[finite]
    # top-p: the shortest prefix (by descending probability, untempered) whose mass
    # reaches p; the token that crosses p is kept, as llama.cpp does.
    if settings.top_p < 1.0:
        cumulative = np.cumsum(_softmax(candidate_logits))
        n_keep = int(np.searchsorted(cumulative, settings.top_p, side="left")) + 1
        candidates, candidate_logits = candidates[:n_keep], candidate_logits[:n_keep]
    # min-p: keep tokens whose probability is at least min_p times the top one's,
    # i.e. logit >= max_logit + log(min_p) (untempered, as in llama.cpp).
    if settings.min_p > 0.0:
        keep = candidate_logits >= candidate_logits[0] + np.log(settings.min_p)
        candidates, candidate_logits = candidates[keep], candidate_logits[keep]
    return candidates, _softmax(candidate_logits / settings.temperature)


def process_logits(logits: np.ndarray, settings: SamplingSettings) -> np.ndarray:
    """Rows of logits (n, n_vocab) -> rows of sampling probabilities (n, n_vocab).

    Only for temperature > 0; the greedy path never builds distributions.
    """
    if settings.greedy:
        raise ValueError("process_logits is for sampling; greedy decoding uses argmax")
    logits = np.atleast_2d(logits)
    probs = np.zeros(logits.shape, dtype=np.float64)
    for row, out in zip(logits, probs):
        candidates, candidate_probs = sparse_distribution(row, settings)
        out[candidates] = candidate_probs
    return probs


def sample_token(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a (not necessarily normalised) non-negative weight vector."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    # cumulative[index - 1] <= u < cumulative[index], so probs[index] > 0; only rounding
    # at the very top can push index past the end: then take the last possible token.
    return index if index < len(probs) else int(np.flatnonzero(probs)[-1])


def accept_drafts(
    *,
    target_probs: np.ndarray,
    draft_probs: np.ndarray,
    draft_tokens: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """The Leviathan et al. / Chen et al. (2023) rule. Returns (n_accepted, next_token).

    target_probs: (K+1, n_vocab), the verifier's processed distributions at the K
    draft positions and at the bonus position after them. draft_probs: (K, n_vocab),
    the distributions the K draft_tokens were drawn from (one-hot for a
    deterministic drafter). The emitted tokens, draft_tokens[:n_accepted] followed
    by next_token, are distributed exactly as if drawn from the verifier alone.
    """
    n_drafted = len(draft_tokens)
    positions = np.arange(n_drafted)
    target_at = target_probs[positions, draft_tokens]
    draft_at = draft_probs[positions, draft_tokens]
    # Accept draft token x with probability min(1, target(x) / draft(x)):
    # u < target/draft  <=>  u * draft < target, with no division (draft(x) > 0
    # because x was drawn from it; target(x) = 0 always rejects).
    uniforms = rng.random(n_drafted)
    rejected = ~(uniforms * draft_at < target_at)
    if not rejected.any():
        # All K accepted: the verifier's row K+1 gives a bonus token for free.
        return n_drafted, sample_token(target_probs[n_drafted], rng)
    n_accepted = int(np.argmax(rejected))
    # At the first rejection, resample from normalize(max(0, target - draft)):
    # the mass the target has and the draft under-proposed.
    residual = np.maximum(target_probs[n_accepted] - draft_probs[n_accepted], 0.0)
    if residual.sum() <= 0.0:
        # Only reachable when target == draft up to rounding; then target is exact.
        residual = target_probs[n_accepted]
    return n_accepted, sample_token(residual, rng)


def accept_greedy(*, target_logits: np.ndarray, draft_tokens: Sequence[int] | np.ndarray) -> tuple[int, int]:
    """Temperature 0: accept while each draft token is the verifier's argmax.

    target_logits: (K+1, n_vocab). Returns (n_accepted, next_token), where
    next_token is the verifier's argmax at the first mismatch (or the bonus row).
    """
    verifier_choice = np.argmax(target_logits, axis=-1)
    matches = verifier_choice[: len(draft_tokens)] == np.asarray(draft_tokens)
    n_accepted = len(draft_tokens) if matches.all() else int(np.argmin(matches))
    return n_accepted, int(verifier_choice[n_accepted])
