"""`specgguf bench`: plain vs speculative decoding, side by side, in one process.

Runs are interleaved (for each repeat, for each prompt: plain, then every K) so
that machine noise hits both sides alike. Speedup is the ratio of tokens per
second to plain decoding of the same prompt in the same repeat; the spread is
the range of those paired ratios. Prompt ingestion is left out of both sides.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .engine import speculate
from .sampling import SamplingSettings
from .stats import GenerationStats

_CODE = '''def parse_config(path):
    config = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config
'''
_TEXT = ("The city council met on Tuesday to discuss the new bicycle lanes planned for the river "
         "district. Supporters said the lanes would cut traffic and make the streets safer for "
         "children walking to school. Shop owners worried that losing parking spaces would keep "
         "customers away. After three hours of debate, the council voted to build the lanes on two "
         "streets first and to review the effect on local business after six months.")

PROMPTS: dict[str, str] = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "edit": f"Add type hints to this function and return the code only:\n\n{_CODE}",
    "chat": "What are three good habits for staying focused while working from home?",
    "summary": f"Summarise this text in two sentences:\n\n{_TEXT}",
    "repeat": "Count from 1 to 40, writing each number in words on its own line.",
}
QUICK_PROMPTS = ("code", "edit")


@dataclass
class Setting:
    """One measured configuration: K drafts (0 = plain) at one temperature."""

    k: int
    temperature: float
    runs: list[GenerationStats] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # paired with plain, same prompt and repeat
    ratios_by_prompt: dict[str, list[float]] = field(default_factory=dict)

    def total(self) -> GenerationStats:
        total = GenerationStats()
        for run in self.runs:
            for name in ("n_tokens", "n_steps", "n_drafted", "n_accepted", "draft_seconds", "verify_seconds",
                         "sample_seconds", "prefill_seconds", "wall_seconds"):
                setattr(total, name, getattr(total, name) + getattr(run, name))
            for mine, theirs in ((total.drafted_by_position, run.drafted_by_position),
                                 (total.accepted_by_position, run.accepted_by_position)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, count in enumerate(theirs):
                    mine[i] += count
        return total

    def report(self) -> dict:
        total = self.total()
        split = max(total.wall_seconds, 1e-9)
        return {
            "k": self.k, "temperature": self.temperature,
            "tokens_per_second": round(total.tokens_per_second, 3),
            "speedup": round(statistics.median(self.ratios), 3) if self.ratios else None,
            "speedup_min": round(min(self.ratios), 3) if self.ratios else None,
            "speedup_max": round(max(self.ratios), 3) if self.ratios else None,
            "speedup_by_prompt": {kind: round(statistics.median(r), 3) for kind, r in self.ratios_by_prompt.items()},
            "acceptance_rate": None if total.acceptance_rate is None else round(total.acceptance_rate, 4),
            "tokens_per_step": round(total.tokens_per_step, 3),
            "acceptance_by_position": total.as_dict()["acceptance_by_position"],
            "time_split": {"draft": round(total.draft_seconds / split, 4),
                           "verify": round(total.verify_seconds / split, 4),
                           "other": round(total.other_seconds / split, 4)},
            "n_tokens": total.n_tokens, "seconds": round(total.wall_seconds, 3),
        }


def _generate(verifier, draft, tokens: list[int], *, k: int, max_tokens: int, temperature: float,
              seed: int) -> GenerationStats:
    stats = GenerationStats()
    settings = SamplingSettings(temperature=temperature)
    start = time.perf_counter()
    for event in speculate(verifier=verifier, draft=draft, prompt_tokens=tokens, k=k, max_tokens=max_tokens,
                           settings=settings, rng=np.random.default_rng(seed)):
        stats.add(event)
    stats.wall_seconds = time.perf_counter() - start - stats.prefill_seconds
    return stats


def run_bench(*, verifier, draft, prompt_tokens: dict[str, list[int]], ks: list[int], temperatures: list[float],
              repeats: int, max_tokens: int, on_run: Callable[[], None] | None = None) -> list[Setting]:
    """Measure plain (K=0) and every K in `ks`, interleaved, for each temperature."""
    settings = {(k, t): Setting(k, t) for t in temperatures for k in [0, *[k for k in ks if k > 0]]}
    for repeat in range(repeats):
        for kind, tokens in prompt_tokens.items():
            for temperature in temperatures:
                plain_speed = None
                for (k, t), setting in settings.items():
                    if t != temperature:
                        continue
                    stats = _generate(verifier, draft, tokens, k=k, max_tokens=max_tokens,
                                      temperature=temperature, seed=1000 * repeat + 7)
                    setting.runs.append(stats)
                    if k == 0:
                        plain_speed = stats.tokens_per_second
                    elif plain_speed:
                        ratio = stats.tokens_per_second / plain_speed
                        setting.ratios.append(ratio)
                        setting.ratios_by_prompt.setdefault(kind, []).append(ratio)
                    if on_run:
                        on_run()
    return list(settings.values())


def n_runs(*, n_prompts: int, ks: list[int], temperatures: list[float], repeats: int) -> int:
    return repeats * n_prompts * len(temperatures) * (1 + len([k for k in ks if k > 0]))


def best_k(settings: list[Setting], temperature: float) -> tuple[int, float]:
    """The K with the highest median speedup at this temperature (0 if nothing beats plain)."""
    candidates = [(s.report()["speedup"], s.k) for s in settings
                  if s.temperature == temperature and s.k > 0 and s.ratios]
    if not candidates:
        return 0, 1.0
    speedup, k = max(candidates)
    return (k, speedup) if speedup > 1.0 else (0, speedup)
