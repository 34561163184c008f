"""Measurement for `specgguf bench`: plain vs speculative decoding, side by side, in one process.

Runs are interleaved (for each repeat, for each prompt: plain, then every K) so
that machine noise hits both sides alike. Speedup is the ratio of tokens per
second to plain decoding of the same prompt in the same repeat; the spread is
the range of those paired ratios. Prompt ingestion is left out of both sides.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.costs import MachineCosts
from ..core.cross_drafter import CrossVocab
from ..core.drafters import DRAFTER_KINDS, DrafterKind, DraftSettings, build_drafter
from ..core.drafting import Drafter
from ..core.engine import FixedK, KPolicy, speculate
from ..core.events import Generation, GenerationStats
from ..core.kpolicy import K_MAX, PolicyConfig, adaptive_policy
from ..core.model import Model
from ..core.sampling import SamplingSettings
from ..llama.loaded import LoadedModel
from ..tuning import BenchResult

_CODE = """def parse_config(path):
    config = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config
"""
_TEXT = (
    "The city council met on Tuesday to discuss the new bicycle lanes planned for the river "
    "district. Supporters said the lanes would cut traffic and make the streets safer for "
    "children walking to school. Shop owners worried that losing parking spaces would keep "
    "customers away. After three hours of debate, the council voted to build the lanes on two "
    "streets first and to review the effect on local business after six months."
)

PROMPTS: dict[str, str] = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "prose": "Explain why the sky is blue.",
    "edit": f"Add type hints to this function and return the code only:\n\n{_CODE}",
    "chat": "What are three good habits for staying focused while working from home?",
    "summary": f"Summarise this text in two sentences:\n\n{_TEXT}",
    "repeat": "Count from 1 to 40, writing each number in words on its own line.",
}
DEFAULT_PROMPTS = ("code", "edit", "chat", "summary", "repeat")  # `bench` without --prompts
QUICK_PROMPTS = ("code", "edit")
VS_LLAMA_CPP_PROMPTS = ("code", "prose", "edit", "chat")  # issue 12's kinds: where drafting wins and where not


@dataclass
class Setting:
    """One measured configuration: a drafter with a fixed K (0 = plain) or adaptive K, at one temperature."""

    drafter: DrafterKind
    k: int | None  # None: adaptive
    temperature: float
    runs: list[GenerationStats] = field(default_factory=list)
    run_prompts: list[str] = field(default_factory=list)  # the prompt kind of each run
    ratios: list[float] = field(default_factory=list)  # paired with plain, same prompt and repeat
    ratios_by_prompt: dict[str, list[float]] = field(default_factory=dict)
    llama_seconds: float = 0.0  # time inside llama.cpp calls (both models)

    @property
    def label(self) -> str:
        if self.k == 0:
            return "plain"
        return f"{self.drafter} K={'adaptive' if self.k is None else self.k}"

    def policy(self, machine_costs: MachineCosts):
        if self.k is not None:  # a catch-up priced as measured (a prompt the verifier's cache held reads 1 token)
            return FixedK(self.k, read_seconds=machine_costs.draft_read or None)
        return adaptive_policy(self.drafter, machine_costs, PolicyConfig(k_max=K_MAX))

    def total(self) -> GenerationStats:
        total = GenerationStats()
        for run in self.runs:
            total.merge(run)
        return total

    def report(self) -> dict:
        total = self.total()
        split = max(total.wall_seconds, 1e-9)
        return {
            "label": self.label,
            "drafter": self.drafter,
            "k": "adaptive" if self.k is None else self.k,
            "temperature": self.temperature,
            "tokens_per_second": round(total.tokens_per_second, 3),
            "speedup": round(statistics.median(self.ratios), 3) if self.ratios else None,
            "speedup_min": round(min(self.ratios), 3) if self.ratios else None,
            "speedup_max": round(max(self.ratios), 3) if self.ratios else None,
            "speedup_by_prompt": {kind: round(statistics.median(r), 3) for kind, r in self.ratios_by_prompt.items()},
            "acceptance_rate": None if total.acceptance_rate is None else round(total.acceptance_rate, 4),
            "tokens_per_step": round(total.tokens_per_step, 3),
            "acceptance_by_position": total.as_dict()["acceptance_by_position"],
            "time_split": {
                "draft": round(total.draft_seconds / split, 4),
                "verify": round(total.verify_seconds / split, 4),
                "other": round(total.other_seconds / split, 4),
            },
            # A draft of another vocabulary in string mode: its text round trip (decode, re-encode) per step.
            "draft_text_ms_per_step": round(1000 * total.draft_text_seconds / max(total.n_steps, 1), 3),
            "n_tokens": total.n_tokens,
            "seconds": round(total.wall_seconds, 3),
            # The engine's own overhead: wall time not spent inside llama.cpp.
            "overhead": round(max(0.0, 1 - self.llama_seconds / split), 4),
            "runs": [
                {"prompt": kind, "n_tokens": run.n_tokens, "seconds": round(run.wall_seconds, 6)}
                for kind, run in zip(self.run_prompts, self.runs)
            ],
        }


def generate(
    verifier: Model,
    drafter: Drafter | None,
    tokens: list[int],
    *,
    policy: KPolicy,
    max_tokens: int,
    temperature: float,
    seed: int,
) -> GenerationStats:
    """One timed answer; `wall_seconds` leaves the prompt's ingestion out."""
    generation = Generation(
        speculate(
            verifier=verifier,
            drafter=drafter,
            prompt_tokens=tokens,
            k=policy,
            max_tokens=max_tokens,
            settings=SamplingSettings(temperature=temperature),
            rng=np.random.default_rng(seed),
        )
    )
    for _ in generation:
        pass
    return generation.stats


def make_settings(
    *, ks: list[int], adaptive: bool, drafters: list[DrafterKind], temperatures: list[float]
) -> list[Setting]:
    """Plain first, then every drafter with each fixed K and adaptive K (a drafter with n-gram
    drafts always with adaptive K: its point is to be compared with the model's)."""
    settings = []
    for temperature in temperatures:
        settings.append(Setting("model", 0, temperature))
        for drafter in drafters:
            settings += [Setting(drafter, k, temperature) for k in ks if k > 0]
            if adaptive or "ngram" in DRAFTER_KINDS[drafter].sources:
                settings.append(Setting(drafter, None, temperature))
    return settings


def run_bench(
    *,
    verifier: LoadedModel,
    draft: LoadedModel | None,
    prompt_tokens: dict[str, list[int]],
    settings: list[Setting],
    repeats: int,
    max_tokens: int,
    machine_costs: MachineCosts,
    on_run: Callable[[], None] | None = None,
    cross: CrossVocab | None = None,
) -> list[Setting]:
    """Measure every setting, interleaved: for each repeat and prompt, plain then the rest.
    Adaptive settings start from `machine_costs` (costs.py), as `run` would from the store.
    `cross`: the draft has another vocabulary and drafts through text (prepare.pair_cross)."""
    models = [m for m in (verifier, draft) if m is not None]
    for repeat in range(repeats):
        for kind, tokens in prompt_tokens.items():
            plain_speed: dict[float, float] = {}
            for setting in settings:
                # Prompt ingestion is excluded from timings, so a warm prompt cache is fair to all.
                busy_before = sum(m.busy_seconds for m in models)
                stats = generate(
                    verifier,
                    build_drafter(setting.drafter, draft, DraftSettings(cross=cross)),
                    tokens,
                    policy=setting.policy(machine_costs),
                    max_tokens=max_tokens,
                    temperature=setting.temperature,
                    seed=1000 * repeat + 7,
                )
                setting.llama_seconds += sum(m.busy_seconds for m in models) - busy_before - stats.prefill_seconds
                setting.runs.append(stats)
                setting.run_prompts.append(kind)
                if setting.k == 0:
                    plain_speed[setting.temperature] = stats.tokens_per_second
                elif plain_speed.get(setting.temperature):
                    ratio = stats.tokens_per_second / plain_speed[setting.temperature]
                    setting.ratios.append(ratio)
                    setting.ratios_by_prompt.setdefault(kind, []).append(ratio)
                if on_run:
                    on_run()
    return settings


def best_fixed_k(settings: list[Setting], temperature: float) -> BenchResult:
    """The draft model's best fixed K at this temperature; K=0 when nothing beats plain."""
    candidates = [s for s in settings if s.temperature == temperature and s.drafter == "model" and s.k and s.ratios]
    if not candidates:
        return BenchResult(0, 1.0, None)
    best = max(candidates, key=lambda s: statistics.median(s.ratios))
    report = best.report()
    if report["speedup"] <= 1.0:
        return BenchResult(0, report["speedup"], report["acceptance_rate"])
    assert best.k is not None  # the candidates have a fixed K
    return BenchResult(best.k, report["speedup"], report["acceptance_rate"])
