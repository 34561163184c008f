"""Where a run's K comes from: `-k` parsed once into a `KChoice`, and the K policy it gives (`make_policy`,
which prepare.Prepared.policy asks), with a `KSource` that says why, for the stats line.

`-k N`, `-k adaptive`, or `-k auto` (the default). `auto` uses the best K `bench` stored for this pair
here (tuning.py); if that says speculation is slower than plain decoding here, it decodes plain
(`--force-spec` overrides). With nothing stored it chooses K each step (core/kpolicy.py). The stored K
is the draft model's: the n-gram and hybrid drafters always choose K online.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .core.costs import MachineCosts
from .core.drafters import DRAFTER_KINDS, DrafterKind
from .core.drafting import Source
from .core.engine import FixedK, KPolicy
from .core.kpolicy import K_MAX, AdaptiveK, PerSource, PolicyConfig, adaptive_policy
from .errors import UsageError
from .tuning import BenchResult, stored_measurement


@dataclass(frozen=True)
class KChoice:
    mode: Literal["auto", "adaptive", "fixed"]
    k: int | None = None


def parse_k(text: str | None) -> KChoice:
    if text is None or text == "auto":
        return KChoice("auto")
    if text == "adaptive":
        return KChoice("adaptive")
    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"-k/--draft-max takes a number, 'auto' or 'adaptive', not {text!r}") from None
    if not 0 <= k <= 64:
        raise UsageError(f"-k/--draft-max must be between 0 and 64, got {k}")
    return KChoice("fixed", k)


@dataclass(frozen=True)
class KSource:
    """Where a run's K came from, for the stats line."""

    adaptive: bool
    text: str
    decided: bool = False  # adaptive K knew before the first step that drafting cannot win here

    def __str__(self) -> str:
        return self.text


def make_policy(
    choice: KChoice,
    *,
    costs: Callable[[], MachineCosts],
    verifier: Path,
    draft: Path | None,
    drafter: DrafterKind,
    temperature: float,
    recommended_k: int | None,
    force_spec: bool,
    trees: bool = False,
    config: PolicyConfig | None = None,
    read: Callable[[], float | None] = lambda: None,
    measured_acceptance: float | None = None,
) -> tuple[KPolicy, KSource]:
    """The K policy for a run, and where K came from. `costs` is asked only for adaptive K; `read` (the
    draft's reading a token, Prepared.read_cost) only for a fixed K that drafts with a draft model;
    `measured_acceptance` (the draft's, measured greedy here: drafts/made.py) prices a long read
    before its drafts have shown what they do (PolicyConfig.measured_acceptance)."""
    spec = DRAFTER_KINDS[drafter]
    if spec.needs_model and draft is None:
        return FixedK(0), KSource(False, "plain (no draft)")

    def fixed(k: int) -> FixedK:
        return FixedK(k, read_seconds=read() if k and "model" in spec.sources else None)

    if choice.mode == "fixed":
        return fixed(choice.k or 0), KSource(False, f"K={choice.k} (-k)")
    stored = stored_measurement(verifier, draft, temperature) if draft is not None else None
    config = config or PolicyConfig(
        k_max=K_MAX,
        k_min=1 if force_spec else 0,
        trees=trees,
        measured_acceptance=measured_acceptance,
    )
    # The stored K is the draft model's: a kind without one always chooses K online.
    if choice.mode == "adaptive" or not spec.needs_model or stored is None:
        policy = adaptive_policy(drafter, costs(), config)
        if "model" in spec.sources and not policy.drafts("model"):
            machine = costs()
            text = (
                f"K adaptive: the draft model cannot win here (a draft token costs {machine.draft * 1000:.0f} ms,"
                f" a verifier token {machine.verify[0] * 1000:.0f} ms)"
                + ("; n-gram drafts only" if spec.mixed else ": plain decoding")
            )
            return policy, KSource(True, text, decided=True)
        return policy, KSource(True, "K adaptive")
    model_policy, source = _stored_policy(stored, force_spec=force_spec, recommended_k=recommended_k, fixed=fixed)
    if spec.mixed:
        # The stored best K is the draft model's alone: the free n-gram drafts beside it (which
        # may win where bench measured plain faster) still choose their K online.
        policies: dict[Source, KPolicy] = {"model": model_policy}
        policies.update({side: AdaptiveK(costs(), config, source=side) for side in spec.sources if side != "model"})
        return PerSource(policies), KSource(False, f"{source.text}; n-gram K adaptive")
    return model_policy, source


def _stored_policy(
    stored: BenchResult, *, force_spec: bool, recommended_k: int | None, fixed: Callable[[int], FixedK]
) -> tuple[FixedK, KSource]:
    """The draft model's K from what `bench` stored for this pair, machine and temperature."""
    if stored.k == 0:
        if force_spec:
            fallback = recommended_k or 8
            return fixed(fallback), KSource(False, f"K={fallback} (--force-spec; bench measured plain faster here)")
        return fixed(0), KSource(
            False, f"plain: bench measured speculation at {stored.speedup:.2f}× here (--force-spec to speculate)"
        )
    return fixed(stored.k), KSource(False, f"K={stored.k} (bench here: {stored.speedup:.2f}×)")
