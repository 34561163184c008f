"""Running `specgguf bench` for one or more pairs, and showing the results (table or JSON)."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from .bench import PROMPTS, QUICK_PROMPTS, best_k, n_runs, run_bench
from .run import LoadOptions, load_models, prompt_tokens
from .resolve import ResolvedPair


@dataclass(frozen=True)
class BenchTarget:
    label: str
    pair: ResolvedPair


def f16_variant(target: BenchTarget, *, on_progress=None) -> BenchTarget:
    """The same pair with its verifier re-quantized to F16 (memory-bound on a CPU), cached."""
    from .backend import convert_to_f16

    source = target.pair.verifier
    destination = source.with_name(source.stem.rsplit("-", 1)[0] + "-f16.gguf")
    if not destination.is_file():
        convert_to_f16(source, destination)
    pair = ResolvedPair(verifier=destination, draft=target.pair.draft, name=target.pair.name,
                        recommended_k=target.pair.recommended_k)
    return BenchTarget(label=f"{target.label} (F16 verifier)", pair=pair)


def bench(*, targets: list[BenchTarget], ks: list[int], temperatures: list[float], repeats: int,
          max_tokens: int, quick: bool, load: LoadOptions, json_output: bool, out: TextIO,
          err_console: Console) -> dict:
    kinds = list(QUICK_PROMPTS if quick else PROMPTS)
    total_runs = len(targets) * n_runs(n_prompts=len(kinds), ks=ks, temperatures=temperatures, repeats=repeats)
    results = []
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=total_runs)
        for target in targets:
            progress.update(task, description=f"loading {target.label}")
            verifier, draft = load_models(target.pair, load, need_draft=True)
            tokens = {kind: prompt_tokens(verifier, PROMPTS[kind], raw=False, system=None) for kind in kinds}
            progress.update(task, description=target.label)
            settings = run_bench(verifier=verifier, draft=draft, prompt_tokens=tokens, ks=ks,
                                 temperatures=temperatures, repeats=repeats, max_tokens=max_tokens,
                                 on_run=lambda: progress.advance(task))
            results.append({
                "pair": target.label, "verifier": str(target.pair.verifier), "draft": str(target.pair.draft),
                "settings": [setting.report() for setting in settings],
                "best_k": {str(t): dict(zip(("k", "speedup"), best_k(settings, t))) for t in temperatures},
            })
            verifier.close()
            draft.close()
    report = {"machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                          "threads": load.n_threads},
              "prompts": kinds, "repeats": repeats, "max_tokens": max_tokens, "results": results}
    if json_output:
        out.write(json.dumps(report) + "\n")
    else:
        console = Console(file=out, highlight=False, width=None if out.isatty() else 140)
        for result in results:
            console.print(_table(result))
    return report


def _table(result: dict) -> Table:
    table = Table(title=f"{result['pair']}", title_justify="left")
    for column in ("temp", "K", "tok/s", "speedup (min–max)", "accept", "tok/step", "accept by position",
                   "draft/verify/other"):
        table.add_column(column, justify="right" if column not in ("accept by position",) else "left")
    for row in result["settings"]:
        speedup = "1.00 (plain)" if row["k"] == 0 else \
            f"{row['speedup']:.2f} ({row['speedup_min']:.2f}–{row['speedup_max']:.2f})"
        accept = "—" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.0%}"
        positions = " ".join(f"{a:.0%}" for a in row["acceptance_by_position"][:8])
        split = row["time_split"]
        table.add_row(f"{row['temperature']:g}", str(row["k"]), f"{row['tokens_per_second']:.1f}", speedup,
                      accept, f"{row['tokens_per_step']:.2f}", positions,
                      f"{split['draft']:.0%}/{split['verify']:.0%}/{split['other']:.0%}")
    best = "; ".join(f"T={t}: K={b['k']} ({b['speedup']:.2f}×)" for t, b in result["best_k"].items())
    table.caption = f"best K — {best}"
    return table


def parse_list(text: str, kind: type, option: str) -> list:
    from .errors import UsageError

    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"{option} takes a comma-separated list, got {text!r}") from None
