"""A round's price: several requests stepping together in the same passes (serve --parallel).

- A pass of R rows costs T(R) = a + b·R seconds (`Line`: per_pass a, per_row b, fitted by
  llama/sequences.PassCosts from the passes run). With n lanes in one pass, a lane's step of k drafts
  is charged a/n + b·(k + 1) (`Round.prices`): the fixed cost of reading the weights is shared, each
  extra row is not.
- A round where each of n lanes drafts k tokens takes (k + 1)·D(n) + V(n·(k + 1)) seconds (a draft
  pass per position, one more to read the verifier's token; one verify pass) and emits Σ E_i(k)
  tokens: `round_k` is the argmax of their ratio. A draft only one lane has (an n-gram match) is
  priced by `lone_k`: its rows cost the round filler rows or a pass of their own and gain only its
  own tokens.
- Drafting must beat plain steps by SHARED_DRAFT_MARGIN (`_clearly_best`): what these prices leave
  out all counts against drafting.
- E(k) = 1 + a + … + a^k when every draft is right with probability a (`expected_at`); a request
  still gathering evidence is priced optimistically, up to drafts right `worth_trying` of the time
  (`optimistic`), as a lone policy is (kpolicy.AdaptiveK.could_win, best_k).

Tested in tests/test_shared_rounds.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .costs import MachineCosts, StepCosts, extend

K_MAX = 16  # the most drafts per step
SHARED_DRAFT_MARGIN = 1.15  # round_k: how much more a round that drafts must emit per second than a plain one


@dataclass(frozen=True)
class Line:
    """A pass of `rows` rows costs per_pass + per_row·rows seconds (llama/sequences.PassCosts fits it)."""

    per_pass: float
    per_row: float


FREE = Line(0.0, 0.0)  # what proposing an n-gram draft costs


@dataclass(frozen=True)
class Round:
    """The requests stepping in the same passes now: how many, and what a pass of the verifier and
    of the draft costs (None until the passes run taught it)."""

    n_lanes: int = 1
    verify: Line | None = None
    draft: Line | None = None

    @property
    def lanes(self) -> int:
        return max(1, self.n_lanes)

    def prices(self, costs: MachineCosts, k_max: int) -> MachineCosts:
        """A lane's share of a step when the round's requests step alike: k drafts each make a verify
        pass of n·(k + 1) rows, split n ways; a draft pass, n rows. A pass costs per_pass + per_row·rows
        (the `Line`s), or, before those are known, what the table says a batch of that many rows of
        one sequence costs (the same weights are read). Alone: `costs` as they are."""
        n_lanes = self.lanes
        if n_lanes == 1:
            return costs
        rows = n_lanes * (np.arange(k_max + 1) + 1.0)
        if self.verify is not None:
            verify = (self.verify.per_pass + self.verify.per_row * rows) / n_lanes
        else:
            table = np.asarray(costs.rising().verify)
            verify = extend(np.arange(1.0, len(table) + 1), table, rows) / n_lanes
        draft = costs.draft if self.draft is None else (self.draft.per_pass + self.draft.per_row * n_lanes) / n_lanes
        return MachineCosts(tuple(float(x) for x in verify), float(draft), costs.draft_read)


ALONE = Round()


def reprice(costs: StepCosts, before: Round, now: Round, k_max: int) -> bool:
    """Price `costs` for the round `now`, after `before` (the round it was priced for). What the steps
    taught with another number of lanes is forgotten (it priced other batches); with as many, only
    the prior follows the lines. Whether the number of lanes changed."""
    prior = now.prices(costs.base, k_max)
    if now.lanes != before.lanes:
        costs.restart(prior)
        return True
    if now.lanes > 1:
        costs.reprice(prior)
    return False


def expected_at(acceptance: float, k_max: int) -> np.ndarray:
    """E(k) for k = 0..k_max when every draft is right with probability `acceptance` (given the ones
    before it were): 1 + a + … + a^k."""
    return np.cumsum(float(acceptance) ** np.arange(k_max + 1))


def optimistic(learned: np.ndarray, raised: np.ndarray, worth_trying: float) -> np.ndarray:
    """E(k) of a source still gathering evidence: `raised` (c_1 raised by `doubt` standard errors, as
    AdaptiveK.best_k), but never past drafts right `worth_trying` of the time, as AdaptiveK.could_win
    (a round that would not win even so never drafts to find out), and never below `learned`."""
    return np.maximum(learned, np.minimum(raised, expected_at(worth_trying, len(learned) - 1)))


def round_k(expected: Sequence[np.ndarray], *, n_lanes: int, verify: Line, draft: Line) -> int:
    """The most drafts worth drafting in a round of `n_lanes` requests that step together (serve
    --parallel): each drafts k tokens, a draft pass per position (n rows each; one more to read the
    verifier's token), then one verify pass of n·(k + 1) rows, so a round takes (k + 1)·D(n) +
    V(n·(k + 1)) seconds, V(n) without drafts (D, V: the draft's and the
    verifier's pass costs, `Line`s) and emits Σ E_i(k) tokens (`expected`: the lanes' E(k), k =
    0..k_max; lanes without one counted as their average). K = argmax Σ E_i(k) / round seconds: where
    a verify row costs compute, plain steps batched across requests beat drafting long for one."""
    if not expected:
        return K_MAX
    k_max = min(len(e) for e in expected) - 1
    ks = np.arange(k_max + 1)
    draft_passes = ks + (ks > 0)  # and one to catch up on the verifier's token, after a round that drafted
    seconds = (
        draft_passes * (draft.per_pass + draft.per_row * n_lanes)
        + verify.per_pass
        + verify.per_row * n_lanes * (ks + 1)
    )
    tokens = np.mean([e[: k_max + 1] for e in expected], axis=0) * n_lanes
    return _clearly_best(tokens / seconds)


def _clearly_best(rates: np.ndarray) -> int:
    """The K of the highest rate, where drafting (K ≥ 1) must beat plain steps by SHARED_DRAFT_MARGIN:
    what round_k and lone_k leave out all counts against drafting (acceptance learned optimistically;
    a lane that stops short still brings filler rows or costs a pass of its own)."""
    rates = np.array(rates, dtype=float)
    rates[1:] /= SHARED_DRAFT_MARGIN
    return int(np.argmax(rates))


def lone_k(expected: np.ndarray, *, n_lanes: int, verify: Line, draft: Line) -> int:
    """The most drafts worth drafting for one lane whose drafts the round's other n − 1 lanes do not
    share (an n-gram match is one request's; serve --parallel). Its k drafts cost the round one more
    pass for its rows, or filler rows for every other lane (llama/sequences.py), whichever is cheaper,
    V(n) + min(V(k), b·n·k), plus k + 1 draft passes (none for a free drafter), and gain only its own
    E(k) − 1 tokens: K = argmax (n − 1 + E(k)) / round seconds. With one lane, as alone."""
    ks = np.arange(len(expected))
    extra = np.minimum(verify.per_pass + verify.per_row * ks, verify.per_row * n_lanes * ks)
    draft_passes = ks + (ks > 0)
    seconds = (
        verify.per_pass
        + verify.per_row * n_lanes
        + np.where(ks > 0, extra, 0.0)
        + draft_passes * (draft.per_pass + draft.per_row)
    )
    return _clearly_best((n_lanes - 1 + np.asarray(expected, dtype=float)) / seconds)
