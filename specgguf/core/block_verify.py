"""Block verification: a chain of drafts accepted jointly, in pure numpy.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates
Speculative Decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2. Beside the token-by-token rule
(sampling.accept_drafts) it is another acceptance rule for the same chain of K drafts, the same
verifier rows and the same draft rows; its output law is the verifier's too, and it never keeps
fewer drafts on average (the paper's Theorem 2: it keeps the most any valid rule can, knowing
only the per-position conditionals). At temperature 0 both rules are "accept while the draft is
the verifier's argmax": the engine uses that greedy rule under either.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .sampling import sample_token


def block_weights(
    *, target_probs: np.ndarray, draft_probs: np.ndarray, draft_tokens: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The deterministic half of block verification: (stop_weights, residuals).

    target_probs: (K+1, n_vocab), row i the verifier's processed distribution after i drafts;
    draft_probs: (K, n_vocab), row i the distribution draft i was drawn from. With x_i the i-th
    draft (1-based) and weight_0 = 1, position by position:

        weight_i   = min(1, weight_{i-1} * target_probs[i-1](x_i) / draft_probs[i-1](x_i))
        residual_i = max(0, weight_i * target_probs[i] - draft_probs[i])        (a vector; i < K)
        stop_i     = sum(residual_i) / (sum(residual_i) + 1 - weight_i)          (i < K)
        stop_K     = weight_K

    weight_i is the running product of the ratios, capped at 1 wherever it crosses 1 (not each
    ratio capped alone, as the token rule caps them): a draft the verifier likes more than the
    draft did pays back an earlier one it liked less. residual_i is the mass the draft
    under-proposes after x_1..x_i once the prefix's weight is counted; stop_i is how much of
    "keep x_1..x_i and draw the next token from residual_i" the prefix may take. residuals[0] is
    max(0, target_probs[0] - draft_probs[0]), the token rule's residual for the first draft.
    A stop weight of 0/0 (weight_i = 1 and nothing under-proposed) is 0: there is nothing to draw.
    """
    n_drafts = len(draft_tokens)
    stop_weights = np.zeros(n_drafts)
    residuals = [np.maximum(target_probs[0] - draft_probs[0], 0.0)] if n_drafts else []
    weight = 1.0
    for i, token in enumerate(draft_tokens):
        # draft_probs[i][token] > 0: the token was drawn from that row (a one-hot row for n-grams).
        weight = min(1.0, weight * float(target_probs[i][token]) / float(draft_probs[i][token]))
        if i == n_drafts - 1:
            stop_weights[i] = weight
            break
        residual = np.maximum(weight * target_probs[i + 1] - draft_probs[i + 1], 0.0)
        mass = float(residual.sum())
        stop_weights[i] = mass / (mass + 1.0 - weight) if mass + 1.0 - weight > 0.0 else 0.0
        residuals.append(residual)
    return stop_weights, residuals


def accept_block(
    *,
    target_probs: np.ndarray,
    draft_probs: np.ndarray,
    draft_tokens: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Block verification of a chain of K drafts. Returns (n_accepted, next_token), as
    sampling.accept_drafts does, with the same arguments.

    With the stop weights and residuals of `block_weights`:

        draw u_1..u_K uniform in [0, 1)
        tau = the largest i with u_i < stop_i  (0 if there is none)
        keep x_1..x_tau; the next token is drawn from target_probs[K] if tau = K (the bonus),
        else from normalize(residual_tau)

    Unlike the token rule, a rejection at position i is not final: a later prefix may still be
    kept in full (tau is decided from the end of the block, not the start).

    Why the output is the verifier's: Sun et al. 2025, Theorem 1 (Theorem 2: no valid rule that
    sees only the per-position rows keeps more drafts on average, the token rule included). The
    shape of the proof: weight_i <= the product of the ratios up to x_i, so a kept prefix's mass,
    draft(x_1..x_i) * weight_i, never exceeds its verifier probability target(x_1..x_i); what a
    prefix is short of, the residual drawn after it adds back, and stop_i splits the prefix's
    chance between "stop here" and "a longer prefix is kept" so that, by induction from the
    block's end, each sequence gets exactly its verifier probability. With K = 1 it is the token
    rule (stop_1 = min(1, p(x) / q(x)), then the token rule's residual). tests/test_block_verify.py
    checks the law exactly, by enumeration over small tables, and through the engine with
    chi-square tests.
    """
    stop_weights, residuals = block_weights(
        target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens
    )
    n_drafts = len(draft_tokens)
    kept = np.flatnonzero(rng.random(n_drafts) < stop_weights)
    n_accepted = int(kept[-1]) + 1 if kept.size else 0
    if n_accepted == n_drafts:
        return n_accepted, sample_token(target_probs[n_drafts], rng)
    residual = residuals[n_accepted]
    # A zero residual means the rows agree up to rounding there: stopping had no chance, keep the row.
    return n_accepted, sample_token(residual if residual.sum() > 0.0 else target_probs[n_accepted], rng)
