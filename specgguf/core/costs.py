"""What a step costs on this machine: the verifier's batch costs and the draft's token cost.

Adaptive K weighs the tokens a draft may win against what drafting and verifying
cost, so it needs those costs before the first step: learning them by drafting
loses time exactly where speculation does not pay. `tuning.probe` measures them
once per machine, model file and settings (a few seconds, announced) with `measure`
and keeps them in tuning.json; `bench` measures a longer, repeated table that replaces it.
That table is only the prior: `StepCosts` learns each cost from the steps actually run
(a probe on a busy machine is easily several times too slow), and what a long enough
run learned goes back to tuning.json as the next run's prior (tuning.keep_learned).

On a CPU the verify cost is not a straight line in the batch size: llama.cpp
picks kernels by batch shape (one token goes through matrix-vector kernels, the
repacked Q4_K matrix-matrix kernels take rows four at a time), so the table is
kept as measured. docs/adaptive-k.md has tables measured on one machine.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .drafting import LONG_READ
from .model import Model

PROBE_BATCH = 6  # the probe times batches of 1..6 tokens (K up to 5); the policy extends the table past that
PROBE_CONTEXT = 32
LEARN_WINDOW = 32  # recent measurements per cost whose median the policy uses
LEARNED_MIN_STEPS = 32  # steps a run must have taken before what it learned replaces tuning.json's costs
# A batch of n rows never costs more than n passes of one (it could be run so): a table measured past
# that, by more than this slack, was measured while something else took the cores (a build beside the
# probe: 2 rows 3.8x one), and kept as the prior it would stop every draft for good (`disturbed`).
# Past it by a millisecond at least: a tiny model's passes of 0.1 ms jitter by as much as they cost.
SUBADDITIVE_SLACK, DISTURBANCE = 1.25, 0.001


@dataclass(frozen=True)
class MachineCosts:
    verify: tuple[float, ...]  # seconds to verify a batch of 1, 2, … tokens
    draft: float = 0.0  # seconds per token the draft model proposes (0.0: no draft model)
    draft_read: float = 0.0  # seconds per token the draft model reads a context in one batch (0.0: not measured)

    def __post_init__(self) -> None:
        if len(self.verify) < 2:
            raise ValueError("a verify-cost table needs at least two batch sizes")

    def rising(self) -> MachineCosts:
        """These costs with a verify table that never falls: each batch costs at least what a smaller
        one does. For rates compared against plain decoding (calibration.py's expected_rate and
        ngram_rate): noise that makes 2 rows cheaper than 1 would let any draft, even one never
        right, look faster than plain."""
        return MachineCosts(tuple(float(x) for x in np.maximum.accumulate(self.verify)), self.draft, self.draft_read)


def measure(
    model: Model,
    *,
    max_batch: int,
    repeats: int = 3,
    context: int = 256,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> list[float]:
    """Seconds to evaluate a batch of n = 1..max_batch tokens (index n − 1) with logits for
    every row, as a verify step asks, after `context` tokens already in the cache.

    The median (or `statistic`) over `repeats` rounds; each round runs every size once, so a
    change of machine load hits all sizes alike. Token ids are arbitrary (the cost does not depend
    on them). The KV cache is left empty.
    """
    context, batch = _after_context(model, context, max_batch)
    model.eval(batch, n_logits=max_batch)  # warm-up: first-use allocations, caches
    model.rewind(context)
    timings: list[list[float]] = [[] for _ in range(max_batch)]
    for _ in range(repeats):
        for n in range(1, max_batch + 1):
            started = time.perf_counter()
            model.eval(batch[:n], n_logits=n)
            timings[n - 1].append(time.perf_counter() - started)
            model.rewind(context)
    model.rewind(0)
    return [statistic(t) for t in timings]


def measure_read(model: Model, *, n: int = 128, repeats: int = 2, context: int = PROBE_CONTEXT) -> float:
    """Seconds a token to read `n` tokens in one batch after `context` (its last row's logits only,
    as a draft model catching up on a long prompt reads): the fastest of `repeats`. The KV cache is
    left empty."""
    context, batch = _after_context(model, context, max(1, min(n, model.n_ctx // 2)))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        model.eval(batch, n_logits=1)
        best = min(best, time.perf_counter() - started)
        model.rewind(context)
    model.rewind(0)
    return best / len(batch)


def _after_context(model: Model, context: int, n: int) -> tuple[int, list[int]]:
    """An empty cache filled with `context` arbitrary tokens (fewer where the context must leave room
    for n more), and n more to time after them: (the context's length, those n)."""
    context = max(1, min(context, model.n_ctx - n))
    filler = [(17 + 31 * i) % model.n_vocab for i in range(context + n)]
    model.rewind(0)
    model.eval(filler[:context], n_logits=1)
    return context, filler[context:]


def disturbed(costs: Sequence[float]) -> int | None:
    """The first batch size whose measured cost is past what that many single passes cost (with
    `SUBADDITIVE_SLACK`, by `DISTURBANCE` or more): a table measured on a busy machine. None for a
    plausible table."""
    for n, cost in enumerate(costs, 1):
        if cost > SUBADDITIVE_SLACK * n * costs[0] + DISTURBANCE:
            return n
    return None


def describe(costs: list[float]) -> str:
    """One line for people: 'verify ms by batch size: 1: 37 · 2: 61 · …'."""
    return "verify ms by batch size: " + " · ".join(f"{n}: {c * 1000:.0f}" for n, c in enumerate(costs, 1))


class MeasuredStep(Protocol):
    """What StepCosts reads of a step (engine.StepEvent): its size and where its time went."""

    @property
    def tokens(self) -> list[int]: ...
    @property
    def n_drafted(self) -> int: ...
    @property
    def chain_drafted(self) -> int: ...
    @property
    def draft_source(self) -> str | None: ...
    @property
    def draft_seconds(self) -> float: ...
    @property
    def draft_catchup_seconds(self) -> float: ...
    @property
    def draft_catchup_tokens(self) -> int: ...
    @property
    def draft_read_ahead(self) -> int: ...
    @property
    def verify_seconds(self) -> float: ...
    @property
    def sample_seconds(self) -> float: ...


class Recent:
    """A cost learned from the steps: the median of the most recent measurements, with a prior
    counted as `trust` of them. One wild step moves nothing; once a few more measurements than
    `trust` agree, they decide, and the window follows the machine's load and the context's length."""

    def __init__(self, *, trust: int, window: int = LEARN_WINDOW):
        self.trust = trust
        self.samples: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)

    def __len__(self) -> int:
        return len(self.samples)

    def estimate(self, prior: float) -> float:
        values = sorted([*self.samples, *[prior] * self.trust])
        if not values:
            return prior
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


class StepCosts:
    """T(k), the seconds a step with k drafts takes: learned from the steps run, the costs measured
    before generation (a `MachineCosts`, tuning.json's table) only as the prior.

    - Scale: the median ratio of measured to tabled verify cost over recent steps (past the table's
      end, to its slope extended). It moves every cost alike (a busy probe, a longer context, a loaded machine) and
      prices what no step has measured yet, the draft model's token included: one scale for both
      models, so a slower verifier alone never makes drafting look cheaper than it is.
    - Each batch size: the median of its own recent verify times, the scaled table counted as
      `trust` of them; a size past the table starts from the learned curve's slope.
    - Each source's draft cost per token, the same way (the model's prior scaled; n-gram drafts ~0).
    """

    def __init__(self, costs: MachineCosts, *, trust: int):
        self.base = costs  # the prior for a request alone (rounds.reprice prices shared batches from it)
        self.trust = trust
        self.n_steps = 0
        self._start(costs)

    def _start(self, costs: MachineCosts) -> None:
        """Take `costs` as the prior, with nothing learned yet."""
        self.table = np.asarray(costs.verify, dtype=float)
        self.prior_draft: dict[str, float] = {"model": costs.draft}
        self.ratio = Recent(trust=self.trust)  # measured / tabled verify seconds
        self.verify_by_k: dict[int, Recent] = {}  # k drafts -> recent verify seconds for k + 1 tokens
        self.draft_by_source: dict[str, Recent] = {}  # seconds per draft token
        self.overhead_seconds = Recent(trust=0)  # per step, outside drafting and verifying (sampling, rollback)
        self.catchup_seconds = Recent(trust=0)  # the draft model reading tokens decoded without it
        self._curve: tuple[np.ndarray, np.ndarray] | None = None
        self._known: dict[str, float] = {}  # estimates since the last step (a policy asks many times a step)

    def restart(self, prior: MachineCosts) -> None:
        """Take `prior` as the prior and forget what the steps taught (they priced other batches)."""
        self._start(prior)

    def reprice(self, prior: MachineCosts) -> None:
        """Take `prior` as the prior; what the steps taught stays."""
        self.table, self.prior_draft["model"] = np.asarray(prior.verify, dtype=float), prior.draft
        self._curve = None
        self._known.clear()

    def _cached(self, name: str, estimate: Callable[[], float]) -> float:
        if name not in self._known:
            self._known[name] = estimate()
        return self._known[name]

    @property
    def scale(self) -> float:
        return self._cached("scale", lambda: self.ratio.estimate(1.0))

    @property
    def overhead(self) -> float:
        return self._cached("overhead", lambda: self.overhead_seconds.estimate(0.0))

    def draft_seconds(self, source: str) -> float:
        """Seconds per draft token from this source: learned, or the prior at the learned scale."""
        prior = self.scale * self.prior_draft.get(source, 0.0)
        recent = self.draft_by_source.get(source)
        return prior if recent is None else self._cached(f"draft {source}", lambda: recent.estimate(prior))

    def read_seconds(self, source: str) -> float | None:
        """Seconds a token the draft model takes to read a long unread context: measured before
        generation, at the learned scale (None: not measured, or a source that reads nothing)."""
        return self.scale * self.base.draft_read if source == "model" and self.base.draft_read > 0 else None

    def measured(self, k: int) -> bool:
        """Whether steps measured verifying k drafts often enough to outvote the prior."""
        return len(self.verify_by_k.get(k, ())) > self.trust

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(k, seconds) for the table's sizes and every size steps measured past it, as learned."""
        if self._curve is None:
            scale = self.scale
            sizes = np.arange(len(self.table))
            costs = [
                self.verify_by_k[k].estimate(scale * c) if k in self.verify_by_k else scale * c
                for k, c in enumerate(self.table)
            ]
            for k in sorted(k for k in self.verify_by_k if k >= len(self.table)):
                prior = float(extend(sizes, np.asarray(costs), np.array([k]))[0])
                sizes, costs = np.append(sizes, k), [*costs, self.verify_by_k[k].estimate(prior)]
            self._curve = sizes, np.asarray(costs)
        return self._curve

    def verify(self, ks: np.ndarray) -> np.ndarray:
        """Seconds to verify k drafts (a batch of k + 1): the learned curve, interpolated between
        the sizes it knows, past them the slope of its last half."""
        sizes, costs = self.curve()
        return extend(sizes, costs, np.asarray(ks, dtype=float))

    def per_extra_token(self) -> float:
        """Seconds one more token adds to a verify batch: the learned table's average slope."""
        costs = self.verify(np.arange(len(self.table)))
        return float(max(0.0, costs[-1] - costs[0]) / max(1, len(self.table) - 1))

    def step(self, ks: np.ndarray, source: str = "model") -> np.ndarray:
        ks = np.asarray(ks)
        # (never 0: a model that takes no measurable time, as a test's fake, still has rates)
        return np.maximum(ks * self.draft_seconds(source) + self.verify(ks) + self.overhead, 1e-9)

    def observe(self, event: MeasuredStep) -> None:
        if not event.tokens and event.n_drafted == 0:
            return
        k, self.n_steps, self._curve = event.n_drafted, self.n_steps + 1, None
        self._known.clear()
        self.overhead_seconds.add(event.sample_seconds)
        tabled = extend(np.arange(len(self.table)), self.table, np.array([k]))[0]  # past its end: its slope
        self.ratio.add(event.verify_seconds / tabled)
        self.verify_by_k.setdefault(k, Recent(trust=self.trust)).add(event.verify_seconds)
        if event.chain_drafted and event.draft_source is not None:
            # A draft token is priced at a pass of the draft model: drafts read ahead with a guess
            # (model_drafter) are a saving not counted on. Priced at what they cost, a draft model
            # looked cheaper everywhere for what it saved where prompt lookup guessed well, and an
            # editor's completions, where its drafts are mostly refused, drafted more from it.
            passes = max(1, event.chain_drafted - event.draft_read_ahead)
            per_token = (event.draft_seconds - event.draft_catchup_seconds) / passes
            self.draft_by_source.setdefault(event.draft_source, Recent(trust=self.trust)).add(per_token)
            # What a probe catches up on after plain steps (`AdaptiveK.probe_wait`); a long read is the
            # reading rule's purchase (drafting.Reading), priced there: counted here, one 2.2 s read of an
            # agent's prompt made the median of two catch-ups 1.1 s, and the draft model, off after three
            # wrong drafts, waited 384 plain steps for its next probe (docs/benchmarks.md, "The reading's rent").
            if event.draft_catchup_seconds and event.draft_catchup_tokens <= LONG_READ:
                self.catchup_seconds.add(event.draft_catchup_seconds)

    def learned(self, *, min_steps: int = LEARNED_MIN_STEPS) -> MachineCosts | None:
        """What the steps taught, as a table of the prior's shape (for tuning.json: the next run's
        prior), or None before `min_steps` steps: a short run's few steps are not kept."""
        verify, draft = self.verify(np.arange(len(self.table))), self.draft_seconds("model")
        if self.n_steps < min_steps or not (np.all(verify > 0) and np.isfinite(verify).all() and draft >= 0):
            return None  # (a model that takes no time, as a fake's, teaches nothing to keep)
        return MachineCosts(tuple(float(c) for c in verify), draft, self.base.draft_read)


def extend(sizes: np.ndarray, costs: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Interpolate costs by size; past the last size, the slope of the known costs' last half."""
    half = int(np.searchsorted(sizes, sizes[-1] / 2))
    slope = max(0.0, (costs[-1] - costs[half]) / max(1.0, sizes[-1] - sizes[half]))
    return np.where(ks <= sizes[-1], np.interp(ks, sizes, costs), costs[-1] + slope * (ks - sizes[-1]))
