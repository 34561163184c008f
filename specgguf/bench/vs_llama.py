"""`specgguf bench --vs-llama-cpp DIR`: llama.cpp's own programs and specgguf, same prompts, side by side.

For each repeat, prompt and temperature, in turn (so machine noise hits all alike):
llama.cpp plain (llama-completion), specgguf plain (-k 0), then for each fixed K
llama.cpp's llama-speculative-simple and specgguf -k K, then specgguf's default
(adaptive K: what `run` does when `bench` has stored no K for the pair). Both sides get
the same prompt text (the verifier's chat template, rendered here; llama.cpp reads it
as is, and the prompt token counts are checked equal), the same threads, context size,
answer length, sampling settings and seed.

The numbers are generation tokens per second, the prompt left out, median over repeats:
- specgguf: generated tokens / (wall time − prompt ingestion), as `bench` measures;
- llama-completion: its decode calls after the prompt / (their time + sampling time);
- llama-speculative-simple: its own "decoded N tokens in X seconds" (every step after the prompt).
Each llama.cpp run is a fresh process (loading is not in its numbers); ours run in this process, with our
models closed while llama.cpp's run and loaded again before ours (our_side.py: each side alone).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TextIO

from rich.console import Console

from ..conversation import Message, Prompts
from ..core.ngram_cache import SessionNgrams
from ..core.sampling import SamplingSettings
from ..errors import SpecggufError, UsageError
from ..kchoice import KChoice
from ..llama.loaded import LoadedModel
from ..llama.threads import usable_cores
from ..prepare import LoadOptions, Prepared
from .command import BenchPlan, BenchTarget, run_progress, says
from .llama_tools import LlamaTools, ToolRun, ToolSettings, run_plain, run_speculative
from .machine import machine_lines, machine_report
from .measure import PROMPTS, generate
from .our_side import OurSide
from .suite import SuitePrompt
from .vs_tables import ratio_table, speed_table

Side = Literal["llama.cpp", "specgguf"]
MEANING = (
    "tok/s: generation only (prompt left out), median over repeats. specgguf: generated tokens / (wall − "
    "prompt ingestion), as `bench` measures. llama.cpp plain: llama-completion's decode calls after the "
    "prompt / (their time + sampling time), from its llama_perf lines. llama.cpp K: "
    "llama-speculative-simple's 'decoded N tokens in X s'. specgguf default: the hybrid drafter with adaptive K "
    "and a new n-gram cache each run, with the draft made for this machine (--draft-variant auto), what `run` does "
    "with no K stored by `bench`. specgguf K: the draft model alone, the same draft file as llama.cpp's."
)


@dataclass(frozen=True)
class Column:
    side: Side
    k: int | None  # 0: plain decoding; None: specgguf's default (adaptive K)

    @property
    def label(self) -> str:
        if self.k is None:
            return f"{self.side} default"
        return f"{self.side} {'plain' if self.k == 0 else f'K={self.k}'}"


def run_order(ks: list[int]) -> list[Column]:
    """The order the columns run within a cell: each llama.cpp setting next to ours (`_measure` runs it
    reversed on odd repeats)."""
    order = [Column("llama.cpp", 0), Column("specgguf", 0)]
    for k in ks:
        order += [Column("llama.cpp", k), Column("specgguf", k)]
    return order + [Column("specgguf", None)]


def display_order(ks: list[int]) -> list[Column]:
    """The order of the table: llama.cpp's, then ours (as in issue 12)."""
    return [
        Column("llama.cpp", 0),
        *(Column("llama.cpp", k) for k in ks),
        Column("specgguf", 0),
        Column("specgguf", None),
        *(Column("specgguf", k) for k in ks),
    ]


@dataclass
class Cell:
    """One prompt at one temperature: every column's runs."""

    kind: str
    temperature: float
    runs: dict[Column, list[dict]] = field(default_factory=dict)

    def add(self, column: Column, *, n_tokens: int, seconds: float, **details) -> None:
        self.runs.setdefault(column, []).append(
            {
                "n_tokens": n_tokens,
                "seconds": round(seconds, 6),
                "tokens_per_second": n_tokens / seconds if seconds > 0 else 0.0,
                **details,
            }
        )

    def speed(self, column: Column) -> float:
        return statistics.median(run["tokens_per_second"] for run in self.runs[column])

    def best_k(self, ks: list[int]) -> int | None:
        """llama.cpp's fastest fixed K here (None: no K measured)."""
        return max(ks, key=lambda k: self.speed(Column("llama.cpp", k))) if ks else None

    def ratios(self, ks: list[int]) -> dict[str, float]:
        """Ours over llama.cpp's: default vs plain, default vs llama.cpp's best fixed K, and K vs K."""
        ours_default, llama_plain = self.speed(Column("specgguf", None)), self.speed(Column("llama.cpp", 0))
        ratios = {
            "default / llama.cpp plain": ours_default / llama_plain,
            "plain / llama.cpp plain": self.speed(Column("specgguf", 0)) / llama_plain,
            "default / plain": ours_default / self.speed(Column("specgguf", 0)),
        }
        best_k = self.best_k(ks)
        if best_k is not None:
            ratios["default / llama.cpp best K"] = ours_default / self.speed(Column("llama.cpp", best_k))
        for k in ks:
            ratios[f"K={k} / llama.cpp K={k}"] = self.speed(Column("specgguf", k)) / self.speed(Column("llama.cpp", k))
        return ratios

    def report(self, ks: list[int]) -> dict:
        return {
            "prompt": self.kind,
            "temperature": self.temperature,
            "tokens_per_second": {c.label: round(self.speed(c), 3) for c in display_order(ks)},
            "llama_cpp_best_k": self.best_k(ks),
            "ratios": {name: round(value, 3) for name, value in self.ratios(ks).items()},
            "runs": {c.label: self.runs[c] for c in display_order(ks)},
        }


@dataclass(frozen=True)
class VsPlan:
    ks: list[int]
    temperatures: list[float]
    prompts: list[str]  # the prompts' names: keys of `texts`
    repeats: int
    max_tokens: int
    texts: dict[str, str]  # name -> the user's message
    kinds: dict[str, str]  # name -> its kind (bench/suite.py's KINDS; bench's own prompts: their name)
    machine: bool = False  # also report the CPU and llama-bench's verify curve (the suite does)


def vs_plan(plan: BenchPlan, suite: list[SuitePrompt] | None = None) -> VsPlan:
    """bench's plan for this comparison: the draft model's drafting (llama.cpp's draft-simple) and
    our default, at each fixed K but 0 (plain decoding is always measured)."""
    if plan.drafters != ["model"] or not plan.adaptive:
        raise UsageError(
            "--vs-llama-cpp compares the draft model's drafting (llama.cpp's draft-simple) and"
            " specgguf's default: --drafters and --no-adaptive do not apply"
        )
    return VsPlan(
        ks=sorted({k for k in plan.ks if k > 0}),
        temperatures=plan.temperatures,
        prompts=[p.name for p in suite] if suite else plan.prompts,
        repeats=plan.repeats,
        max_tokens=plan.max_tokens,
        texts={p.name: p.text for p in suite} if suite else {kind: PROMPTS[kind] for kind in plan.prompts},
        kinds={p.name: p.kind for p in suite} if suite else {kind: kind for kind in plan.prompts},
        machine=bool(suite),
    )


def compare(
    *,
    targets: list[BenchTarget],
    tools: LlamaTools,
    plan: VsPlan,
    load: LoadOptions,
    json_output: bool,
    out: TextIO,
    err_console: Console,
) -> dict:
    """Measure every target pair against llama.cpp's programs; print or return the tables."""
    # One fixed count, given to both sides (ours would otherwise follow the machine's load: llama/threads.py).
    n_threads = load.n_threads or usable_cores()
    load = dataclasses.replace(load, n_threads=n_threads)
    order = run_order(plan.ks)
    total = len(targets) * plan.repeats * len(plan.prompts) * len(plan.temperatures) * len(order)
    results = []
    with run_progress(err_console) as progress:
        task = progress.add_task("comparing with llama.cpp", total=total)
        for target in targets:
            results.append(_compare_target(target, tools, plan, order, load, progress=says(progress, task)))
    verifiers = [(target.label, target.pair.verifier) for target in targets]
    machine = machine_report(tools, verifiers, n_threads) if plan.machine else None
    report = {
        "machine": machine,
        "llama_cpp": str(tools.directory),
        "threads": n_threads,
        "max_tokens": plan.max_tokens,
        "repeats": plan.repeats,
        "ks": plan.ks,
        "temperatures": plan.temperatures,
        "prompts": plan.prompts,
        "meaning": MEANING,
        "results": results,
    }
    if json_output:
        out.write(json.dumps(report) + "\n")
    else:
        console = Console(file=out, highlight=False, width=None if out.isatty() else 160)
        if machine:
            console.print(machine_lines(machine))
        for result in results:
            console.print(speed_table(result, report))
            console.print(ratio_table(result))
            console.print(
                "lowest: "
                + "; ".join(
                    f"{name} {w['ratio']:.2f}× ({w['prompt']}, T {w['temperature']:g})"
                    for name, w in result["worst"].items()
                )
            )
        console.print(MEANING, style="dim")
    return report


def _compare_target(
    target: BenchTarget,
    tools: LlamaTools,
    plan: VsPlan,
    order: list[Column],
    load: LoadOptions,
    *,
    progress: Callable[[str | None], None],
) -> dict:
    """One pair against llama.cpp's programs, every cell; `progress` as bench.command.says makes it."""
    ours = OurSide(target, load, progress)
    try:
        prepared, default = ours.open()
        progress(target.label)
        prompts = Prompts(prepared.verifier)
        tokens = {name: prompts.question(plan.texts[name], raw=False, system=None) for name in plan.prompts}
        texts = {name: _prompt_text(prepared.verifier, plan.texts[name]) for name in plan.prompts}
        assert load.n_threads is not None  # compare fixed it
        cells = _measure(
            ours,
            tools,
            plan,
            order,
            tokens,
            texts,
            n_threads=load.n_threads,
            n_ctx=load.n_ctx,
            on_run=lambda: progress(None),
        )
    finally:
        ours.close()
    choice = ours.draft_choice
    return {
        "pair": target.label,
        "verifier": str(target.pair.verifier),
        "draft": str(target.pair.draft),
        "default_draft": None if choice is None else {"name": choice.name, "file": str(choice.path), "why": choice.why},
        "prompt_tokens": {k: len(t) for k, t in tokens.items()},
        "cells": [{**c.report(plan.ks), "kind": plan.kinds[c.kind]} for c in cells],
        "worst": worst_ratios([c.report(plan.ks) for c in cells]),
    }


def worst_ratios(cells: list[dict]) -> dict[str, dict]:
    """Each ratio's lowest cell: the floor is per prompt (issue 45), not a median over prompts."""
    worst: dict[str, dict] = {}
    for cell in cells:
        for name, value in cell["ratios"].items():
            if name not in worst or value < worst[name]["ratio"]:
                worst[name] = {"ratio": value, "prompt": cell["prompt"], "temperature": cell["temperature"]}
    return worst


def _measure(
    ours: OurSide,
    tools: LlamaTools,
    plan: VsPlan,
    order: list[Column],
    tokens: dict[str, list[int]],
    texts: dict[str, str],
    *,
    n_threads: int,
    n_ctx: int,
    on_run: Callable[[], None],
) -> list[Cell]:
    cells = {(kind, t): Cell(kind, t) for kind in plan.prompts for t in plan.temperatures}
    for repeat in range(plan.repeats):
        seed = 1000 * repeat + 7  # as `bench`; the two sides' random generators differ all the same
        for kind in plan.prompts:
            for temperature in plan.temperatures:
                cell = cells[(kind, temperature)]
                settings = ToolSettings(
                    n_threads=n_threads,
                    n_ctx=n_ctx,
                    max_tokens=plan.max_tokens,
                    sampling=SamplingSettings(temperature=temperature),
                    seed=seed,
                )
                # Odd repeats run the columns in reverse (ABBA): a column's place in the cell (right after a
                # llama.cpp process exits, or after our other run) biases it by a few percent otherwise.
                for column in order if repeat % 2 == 0 else order[::-1]:
                    if column.side == "llama.cpp":
                        ours.close()  # each side runs alone (our_side.py)
                        run = _llama_run(ours.target, tools, column, texts[kind], settings)
                        if run.n_prompt != len(tokens[kind]):
                            raise SpecggufError(
                                f"llama.cpp read the {kind} prompt as {run.n_prompt} tokens and"
                                f" specgguf as {len(tokens[kind])}: not a like-for-like comparison"
                            )
                        cell.add(
                            column,
                            n_tokens=run.n_tokens,
                            seconds=run.seconds,
                            n_prompt=run.n_prompt,
                            n_drafted=run.n_drafted,
                            n_accepted=run.n_accepted,
                        )
                    else:
                        prepared, default = ours.open()
                        stats = _our_run(
                            default if column.k is None else prepared,
                            column,
                            tokens[kind],
                            temperature=temperature,
                            max_tokens=plan.max_tokens,
                            seed=seed,
                        )
                        cell.add(
                            column,
                            n_tokens=stats.n_tokens,
                            seconds=stats.wall_seconds,
                            n_drafted=stats.n_drafted,
                            n_accepted=stats.n_accepted,
                        )
                    on_run()
    return list(cells.values())


def _prompt_text(verifier: LoadedModel, prompt: str) -> str:
    """The text llama.cpp is given: our chat template rendered (as Prompts.question tokenizes it)."""
    return Prompts(verifier).render([Message("user", prompt)])


def _llama_run(target: BenchTarget, tools: LlamaTools, column: Column, text: str, settings: ToolSettings) -> ToolRun:
    pair = target.pair
    if column.k == 0:
        return run_plain(tools, model=pair.verifier, prompt=text, settings=settings)
    assert column.k is not None and pair.draft is not None
    return run_speculative(tools, model=pair.verifier, draft=pair.draft, k=column.k, prompt=text, settings=settings)


def _our_run(prepared: Prepared, column: Column, tokens: list[int], *, temperature: float, max_tokens: int, seed: int):
    if column.k is None:  # our default drafter; its n-gram cache new for each run (no earlier answers)
        kind = prepared.options.drafter
        policy, _ = prepared.policy(KChoice("adaptive"), temperature=temperature, drafter=kind)
        drafter = prepared.drafter(kind, session=SessionNgrams())
    else:
        # As `run -k N` sets it up (its draft's reading as measured: the verifier's cache holds the prompt).
        policy = prepared.policy(KChoice("fixed", column.k), temperature=temperature, drafter="model")[0]
        drafter = prepared.drafter("model") if column.k else None
    return generate(
        prepared.verifier, drafter, tokens, policy=policy, max_tokens=max_tokens, temperature=temperature, seed=seed
    )
