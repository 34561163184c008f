"""Token distributions and the speculative acceptance rule, in pure numpy.

Nothing here does I/O or keeps global state: every random choice takes the
`numpy.random.Generator` it should use, so tests can replay any run.

The processed distribution follows llama.cpp's default sampler chain
(`common/sampling.cpp`): top-k, then top-p and min-p on the *untempered*
logits, then temperature, then a draw from the softmax. Temperature <= 0 is
greedy decoding: the argmax of the raw logits; so is one below MIN_TEMPERATURE
(dividing by a subnormal overflows to inf, and the softmax would be NaN).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

MIN_TEMPERATURE = 1e-6  # below it, sampling is greedy decoding (and 1/T would overflow near 1e-308)
MIN_REPEAT_PENALTY = 1e-6  # below it, the repeat penalty is this (a logit / 1e-310 overflows to inf)

# How a chain of drafts is accepted when sampling: token by token (`accept_drafts`), or jointly
# (block_verify.accept_block). Trees keep the tree rule; at temperature 0 both are the greedy rule.
Acceptance = Literal["token", "block"]


@dataclass(frozen=True)
class Penalties:
    """Logit bias and llama.cpp's penalties sampler (`llama_sampler_init_penalties`), which run
    before the rest of the chain. Over the last `last_n` tokens of the context (prompt included,
    as llama-server counts them), a token seen `count` times gets its logit divided by `repeat`
    (multiplied, if it is negative), then `count * frequency + presence` subtracted; `bias` adds a
    fixed amount to a token's logit first (OpenAI's `logit_bias`; -inf bans the token)."""

    frequency: float = 0.0
    presence: float = 0.0
    repeat: float = 1.0
    last_n: int = 64
    bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for name, value in (("frequency penalty", self.frequency), ("presence penalty", self.presence)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not (math.isfinite(self.repeat) and self.repeat > 0):
            raise ValueError(f"repeat penalty must be > 0, got {self.repeat}")
        if self.repeat < MIN_REPEAT_PENALTY:  # as a tiny temperature is: the same limit (the repeated
            # token with the largest logit takes it all), without an inf logit and a NaN softmax
            object.__setattr__(self, "repeat", MIN_REPEAT_PENALTY)
        if self.last_n < 0:
            raise ValueError(f"the penalty window must be >= 0 tokens, got {self.last_n}")

    @property
    def active(self) -> bool:
        return bool(self.bias) or (
            self.last_n > 0 and (self.frequency != 0.0 or self.presence != 0.0 or self.repeat != 1.0)
        )


NO_PENALTIES = Penalties()


@dataclass(frozen=True)
class SamplingSettings:
    """The knobs of llama.cpp's sampler chain, with llama.cpp's defaults, and the acceptance rule
    for a chain of drafts (which changes how many drafts are kept, never the output's law)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    penalties: Penalties = field(default=NO_PENALTIES)
    acceptance: Acceptance = "token"

    def __post_init__(self) -> None:
        for name, value in (("temperature", self.temperature), ("top-p", self.top_p), ("min-p", self.min_p)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)  # the one place: run, chat's /temp, the server
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min-p must be in [0, 1], got {self.min_p}")
        if self.acceptance not in ("token", "block"):
            raise ValueError(f"acceptance must be 'token' or 'block', got {self.acceptance!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def apply_penalties(logits: np.ndarray, context: Sequence[int], settings: SamplingSettings) -> np.ndarray:
    """One logits row after the logit bias and the penalties for what `context` (every token before
    this position) holds. The engine applies it to the verifier's rows and the draft model to its
    own, each with its row's own context, so drafts are drawn from, and judged against, the
    penalised distributions and speculation stays exact for them. Unchanged (the same array)
    when nothing is set."""
    penalties = settings.penalties
    if not penalties.active:
        return logits
    logits = logits.astype(np.float64, copy=True)
    for token, bias in penalties.bias:
        if token < logits.shape[0]:
            logits[token] += bias
    window = np.asarray(context[-penalties.last_n :] if penalties.last_n else [], dtype=np.int64)
    window = window[(window >= 0) & (window < logits.shape[0])]
    if window.size:
        tokens, counts = np.unique(window, return_counts=True)
        seen = logits[tokens]
        seen = np.where(seen <= 0, seen * penalties.repeat, seen / penalties.repeat)
        logits[tokens] = seen - counts * penalties.frequency - penalties.presence
    return logits


def _softmax_descending(logits: np.ndarray) -> np.ndarray:
    """The softmax of logits in descending order: their largest, the shift, is the first (no scan for it)."""
    shifted = np.exp(logits - logits[0])
    return shifted / shifted.sum()


@functools.lru_cache(maxsize=64)
def _log_min_p(min_p: float) -> float:
    """log(min_p), as numpy computes it, once per value (a row's cut; called for every row)."""
    return np.log(min_p)


TOP_K_WINDOWS = (12.0, 18.0, 24.0)  # logits within these of the largest are partitioned first (top_k_indices)


def top_k_indices(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest values, in no order. A partition of the whole vocabulary costs
    about 1 ms a row, as much as the rest of a plain step's host work: where at least k values lie
    within a window of the largest (TOP_K_WINDOWS, the narrowest that holds k), the k largest are
    among them, and only those are partitioned (a scan each, ~0.04 ms); else the whole row is."""
    n_values, top = values.shape[0], values.max()
    for window in TOP_K_WINDOWS:
        near = (values >= top - window).nonzero()[0]  # np.flatnonzero of a row, without its dispatch
        if near.size >= n_values:
            break
        if near.size >= k:
            return near[values[near].argpartition(near.size - k)[near.size - k :]]
    return values.argpartition(n_values - k)[n_values - k :]


def sparse_distribution(logits: np.ndarray, settings: SamplingSettings) -> tuple[np.ndarray, np.ndarray]:
    """One logits row -> (token ids, their probabilities): the support of the processed
    distribution, which the chain keeps small (top-k), so draws need not scan the vocabulary.
    A row with no finite entry has an empty support (a draft that cannot score any token allowed there)."""
    # Masked entries (-inf: a grammar's forbidden tokens, tokens a draft cannot propose) never
    # survive; set aside first, as a partition over many equal values is slow (24 ms, not 1).
    finite = np.isfinite(logits)
    pool = None if finite.all() else finite.nonzero()[0]
    if pool is not None and not pool.size:
        return pool, np.zeros(0)
    values = logits if pool is None else logits[pool]
    n_values = values.shape[0]
    # top-k: keep the k largest logits (0 disables).
    # (Array methods rather than np.* functions below: the same operations, without the dispatch that costs
    # more than the work itself on the short rows of a grammar's mask or a test's small vocabulary.)
    if 0 < settings.top_k < n_values:
        candidates = top_k_indices(values, settings.top_k)
        candidate_logits = values[candidates].astype(np.float64)
        order = (-candidate_logits).argsort(kind="stable")
        candidates, candidate_logits = candidates[order], candidate_logits[order]
    else:  # every value a candidate: the order is the candidates (np.arange(n_values)[order])
        candidate_logits = values.astype(np.float64)
        candidates = (-candidate_logits).argsort(kind="stable")
        candidate_logits = candidate_logits[candidates]
    if pool is not None:
        candidates = pool[candidates]
    # top-p: the shortest prefix (by descending probability, untempered) whose mass
    # reaches p; the token that crosses p is kept, as llama.cpp does.
    if settings.top_p < 1.0:
        cumulative = _softmax_descending(candidate_logits).cumsum()
        n_keep = int(cumulative.searchsorted(settings.top_p, side="left")) + 1
        candidates, candidate_logits = candidates[:n_keep], candidate_logits[:n_keep]
    # min-p: keep tokens whose probability is at least min_p times the top one's,
    # i.e. logit >= max_logit + log(min_p) (untempered, as in llama.cpp).
    if settings.min_p > 0.0:
        keep = candidate_logits >= candidate_logits[0] + _log_min_p(settings.min_p)
        candidates, candidate_logits = candidates[keep], candidate_logits[keep]
    return candidates, _softmax_descending(candidate_logits / settings.temperature)  # T > 0 keeps the order


def mask_logits(logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """A grammar's mask on one logits row: forbidden tokens get -inf, so every step of the chain
    above (and the greedy argmax) sees only what the grammar allows, renormalised. None: no grammar."""
    if allowed is None:
        return logits
    if not allowed.any():
        raise ValueError("the grammar allows no token here")
    return np.where(allowed[: logits.shape[-1]], logits, -np.inf)


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
    cumulative = probs.cumsum() if isinstance(probs, np.ndarray) else np.cumsum(probs)
    index = int(cumulative.searchsorted(rng.random() * cumulative[-1], side="right"))
    # cumulative[index - 1] <= u < cumulative[index], so probs[index] > 0; only rounding
    # at the very top can push index past the end: then take the last possible token.
    return index if index < len(probs) else int(np.flatnonzero(probs)[-1])


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """A draft tree's children per node, in node order (the root, the verifier's pending token, is -1)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def accept_tree(
    *,
    target_probs: Callable[[int], np.ndarray],
    draft_probs: Sequence[np.ndarray],
    draft_tokens: Sequence[int],
    parents: Sequence[int],
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling over a draft tree. Returns (accepted path, next_token).

    The tree: node i holds draft_tokens[i], drawn from draft_probs[i] (the draft's
    distribution after its parent's path); parents[i] < i, -1 for the root. Siblings
    are independent draws from the same distribution, in node order, repeats allowed
    (SpecInfer's multi-step speculative sampling, Miao et al. 2024, Algorithm 2).
    target_probs(node) is the verifier's processed distribution after that node's
    path (node -1: after the context). At each node, with p the target and q the draft:

        for each child x, in draw order:
            accept x with probability min(1, p(x) / q(x))   -> go down to x
            else p <- normalize(max(0, p - q))              (the mass q under-proposed)
        no child accepted: the next token is drawn from p

    The emitted tokens (the path, then next_token) are distributed exactly as the
    verifier's own samples. A chain (parents[i] = i - 1) is the Leviathan / Chen rule.
    """
    children = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        p = target_probs(node)
        for child in children.get(node, []):
            x, q = draft_tokens[child], draft_probs[child]
            # u < p(x) / q(x)  <=>  u * q(x) < p(x), with no division (q(x) > 0 because x was
            # drawn from q; p(x) = 0, e.g. a repeat of a rejected sibling, always rejects).
            if rng.random() * q[x] < p[x]:
                path.append(child)
                node = child
                break
            residual = np.maximum(p - q, 0.0)
            # A zero residual means p == q up to rounding: then rejection had no chance, keep p.
            mass = residual.sum()
            p = residual / mass if mass > 0.0 else p
        else:
            return path, sample_token(p, rng)


def accept_tree_greedy(
    *, target_argmax: Callable[[int], int], draft_tokens: Sequence[int], parents: Sequence[int]
) -> tuple[list[int], int]:
    """Temperature 0 over a draft tree: follow the child that is the verifier's argmax after
    its parent's path (node -1: the context). Returns (accepted path, the verifier's next token)."""
    children = children_of(parents)
    path: list[int] = []
    node = -1
    while True:
        choice = target_argmax(node)
        match = next((child for child in children.get(node, []) if draft_tokens[child] == choice), None)
        if match is None:
            return path, choice
        path.append(match)
        node = match


def accept_drafts(
    *,
    target_probs: np.ndarray,
    draft_probs: np.ndarray,
    draft_tokens: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """The Leviathan et al. / Chen et al. (2023) rule on a chain of K drafts: `accept_tree`
    with one child per node. Returns (n_accepted, next_token).

    target_probs: (K+1, n_vocab), the verifier's processed distributions at the K
    draft positions and at the bonus position after them. draft_probs: (K, n_vocab),
    the distributions the K draft_tokens were drawn from (one-hot for a
    deterministic drafter). The emitted tokens, draft_tokens[:n_accepted] followed
    by next_token, are distributed exactly as if drawn from the verifier alone.
    """
    path, next_token = accept_tree(
        target_probs=lambda node: target_probs[node + 1],
        draft_probs=list(draft_probs),
        draft_tokens=[int(token) for token in draft_tokens],
        parents=list(range(-1, len(draft_tokens) - 1)),
        rng=rng,
    )
    return len(path), next_token


def accept_greedy(*, target_logits: np.ndarray, draft_tokens: Sequence[int] | np.ndarray) -> tuple[int, int]:
    """Temperature 0 on a chain: accept while each draft token is the verifier's argmax.

    target_logits: (K+1, n_vocab). Returns (n_accepted, next_token), where
    next_token is the verifier's argmax at the first mismatch (or the bonus row).
    """
    path, next_token = accept_tree_greedy(
        target_argmax=lambda node: int(np.argmax(target_logits[node + 1])),
        draft_tokens=[int(token) for token in draft_tokens],
        parents=list(range(-1, len(draft_tokens) - 1)),
    )
    return len(path), next_token
