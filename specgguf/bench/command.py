"""The `specgguf bench` command: measure one or more pairs (bench/measure.py), store the best K, show the results."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn
from rich.table import Table

from .. import tuning
from ..conversation import Prompts
from ..core import costs
from ..core.cross_drafter import AUTO_CROSS_MODE, CrossModeChoice
from ..core.drafters import DrafterKind, cross_mode_named, drafter_kind
from ..core.kpolicy import K_MAX
from ..drafts.cross_search import kept_mode
from ..errors import SpecggufError, UsageError, terminal_safe
from ..files.resolve import ResolvedPair
from ..prepare import LoadOptions, load_models, pair_cross, placement, where_line
from ..tuning import machine_id, store_measurement
from .measure import (
    DEFAULT_PROMPTS,
    PROMPTS,
    QUICK_PROMPTS,
    VS_LLAMA_CPP_PROMPTS,
    Setting,
    best_fixed_k,
    make_settings,
    run_bench,
)


@dataclass(frozen=True)
class BenchTarget:
    label: str
    pair: ResolvedPair


@dataclass(frozen=True)
class BenchPlan:
    ks: list[int]
    temperatures: list[float]
    drafters: list[DrafterKind]
    adaptive: bool
    repeats: int
    max_tokens: int
    quick: bool
    prompts: list[str]  # keys of bench.measure.PROMPTS
    cross_mode: CrossModeChoice = AUTO_CROSS_MODE  # how a draft of another vocabulary drafts (core/cross_drafter.py)


def run_progress(err_console: Console) -> Progress:
    """The bar every benchmark shows on stderr while it runs (gone when it ends)."""
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


def make_plan(
    *,
    ks: str | None,
    temps: str | None,
    drafters: str,
    prompts: str | None,
    repeats: int | None,
    max_tokens: int | None,
    quick: bool,
    adaptive: bool,
    vs_llama_cpp: bool = False,
    cross_mode: str = AUTO_CROSS_MODE,
) -> BenchPlan:
    """The command's options as a plan. Left out, they take bench's defaults (--quick: a short
    greedy run; --vs-llama-cpp: issue 12's prompt kinds and K 4, 8)."""
    default_prompts: tuple[str, ...]
    if quick:
        default_prompts, default_ks = QUICK_PROMPTS, [4, 8]
    elif vs_llama_cpp:
        default_prompts, default_ks = VS_LLAMA_CPP_PROMPTS, [4, 8]
    else:
        default_prompts, default_ks = DEFAULT_PROMPTS, [2, 4, 8, 12]
    plan = BenchPlan(
        ks=parse_list(ks, int, "-k") if ks else default_ks,
        temperatures=parse_list(temps, float, "--temps") if temps is not None else [0.0] if quick else [0.0, 0.8],
        drafters=[drafter_kind(kind, "--drafters") for kind in parse_list(drafters, str, "--drafters")],
        adaptive=adaptive,
        repeats=repeats or (1 if quick else 2),
        max_tokens=max_tokens or (48 if quick else 128),
        quick=quick,
        prompts=parse_list(prompts, str, "--prompts") if prompts else list(default_prompts),
        cross_mode=cross_mode_named(cross_mode),
    )
    if not plan.temperatures:
        raise UsageError(f"--temps takes a comma-separated list of temperatures, got {temps!r}")
    if any(k < 0 for k in plan.ks) or any(t < 0 for t in plan.temperatures):
        raise UsageError("K values and temperatures must be >= 0")
    if not plan.prompts or set(plan.prompts) - set(PROMPTS):
        raise UsageError(f"--prompts takes {', '.join(PROMPTS)}, got {prompts!r}")
    return plan


def f16_variant(target: BenchTarget) -> BenchTarget:
    """The same pair with its verifier re-quantized to F16 (memory-bound on a CPU), cached."""
    from ..llama.convert import convert_to_f16

    source = target.pair.verifier
    destination = source.with_name(source.stem.rsplit("-", 1)[0] + "-f16.gguf")
    if not destination.is_file():
        convert_to_f16(source, destination)
    pair = ResolvedPair(
        verifier=destination, draft=target.pair.draft, name=target.pair.name, recommended_k=target.pair.recommended_k
    )
    return BenchTarget(label=f"{target.label} (F16 verifier)", pair=pair)


def bench(
    *,
    targets: list[BenchTarget],
    plan: BenchPlan,
    load: LoadOptions,
    json_output: bool,
    plot: Path | None,
    store: bool,
    out: TextIO,
    err_console: Console,
) -> dict:
    if plot is not None:
        check_plot_path(plot)  # before minutes of measuring, not after
    kinds = plan.prompts
    if load.rpc and store:
        # K and verify costs over the network are not this machine's: keep them out of tuning.json.
        store = False
        err_console.print(
            "with --rpc, bench stores nothing for `-k auto` (those figures are this machine's)", style="dim"
        )
    settings_per_target = [
        make_settings(ks=plan.ks, adaptive=plan.adaptive, drafters=plan.drafters, temperatures=plan.temperatures)
        for _ in targets
    ]
    total_runs = sum(len(s) for s in settings_per_target) * len(kinds) * plan.repeats
    results: list[dict] = []
    machines: list[costs.MachineCosts] = []  # seconds, as measured; the JSON report shows them in ms
    stores: list[Callable[[], None]] = []  # into tuning.json, once the results are out
    with run_progress(err_console) as progress:
        task = progress.add_task("benchmarking", total=total_runs)
        for target, settings in zip(targets, settings_per_target):
            result, machine, store_target = _measure_target(target, settings, plan, load, progress=says(progress, task))
            results.append(result)
            machines.append(machine)
            stores.append(store_target)
    report = {
        "machine": {"id": machine_id(), "platform": platform.platform(), "threads": load.n_threads},
        "prompts": kinds,
        "repeats": plan.repeats,
        "max_tokens": plan.max_tokens,
        "results": results,
    }
    if json_output:
        out.write(json.dumps(report) + "\n")
    else:
        _show(results, machines, kinds, out=out, where=bool(load.rpc))
    out.flush()  # the results first, always: a store that fails below loses none of them
    if store and _store_all(stores, err_console) and not json_output:
        err_console.print(
            "stored the best K per pair for `run`/`chat -k auto` on this machine,"
            " and each verifier's verify costs for adaptive K"
        )
    if plot is not None:  # last: a plot that fails loses no result
        try:
            save_plot(report, plot)
        except OSError as error:
            raise SpecggufError(
                f"could not write the plot {plot} ({error.strerror or error}); the results above are complete"
            ) from None
    return report


def _store_all(stores: list[Callable[[], None]], err_console: Console) -> bool:
    """Keep the results in tuning.json; a folder that cannot be written (or a full disk) is a warning."""
    try:
        for store_target in stores:
            store_target()
    except OSError as error:
        err_console.print(
            f"specgguf: warning: could not store the results in {tuning.tuning_path()}"
            f" ({error.strerror or error}); `-k auto` will not use them",
            style="yellow",
            markup=False,
            highlight=False,
        )
        return False
    return True


def _show(
    results: list[dict], machines: list[costs.MachineCosts], kinds: list[str], *, out: TextIO, where: bool
) -> None:
    """The tables, one set per pair (and where its layers ran, with --rpc)."""
    console = Console(file=out, highlight=False, width=None if out.isatty() else 150)
    for result, machine in zip(results, machines):
        if where:
            console.print(result["where"])
        if result["draft_variant"] is not None:
            variant = result["draft_variant"]
            console.print(terminal_safe(f"draft: {variant['name']} ({variant['why']})"))
        console.print(_table(result))
        if len(kinds) > 1:
            console.print(_prompt_table(result, kinds))
        console.print(costs.describe(list(machine.verify)))


def says(progress: Progress, task: TaskID) -> Callable[[str | None], None]:
    """A progress callback: a text becomes the bar's description, None counts one run."""

    def say(text: str | None) -> None:
        progress.advance(task) if text is None else progress.update(task, description=text)

    return say


def _measure_target(
    target: BenchTarget,
    settings: list[Setting],
    plan: BenchPlan,
    load: LoadOptions,
    *,
    progress: Callable[[str | None], None],
) -> tuple[dict, costs.MachineCosts, Callable[[], None]]:
    """Load one pair, measure its costs and every setting; its result, costs, and what stores them
    into tuning.json (called once the results are shown). `progress(text)` says what is going on,
    `progress(None)` counts a run."""
    progress(f"loading {target.label}")
    verifier, draft, choice = load_models(target.pair, load, need_draft=True, announce=progress, cross_ok=True)
    assert draft is not None  # bench's pairs have a draft (tool_commands.bench)
    cross, choice = pair_cross(verifier, draft, choice, kept_mode(plan.cross_mode, draft.path, verifier.path))
    prompts = Prompts(verifier)
    tokens = {kind: prompts.question(PROMPTS[kind], raw=False, system=None) for kind in plan.prompts}
    progress(f"{target.label}: verify cost by batch size")
    # Adaptive K reads this table; measured before the runs, as `run` would find it stored.
    profile = tuning.measure_verify(verifier, max_batch=K_MAX + 1, repeats=1 if plan.quick else 3)
    machine = costs.MachineCosts(tuple(profile), tuning.measure_draft(draft, store=False), costs.measure_read(draft))
    verify_key, draft_key = tuning.key_for(verifier), tuning.key_for(draft, "draft_costs")
    progress(target.label)
    run_bench(
        verifier=verifier,
        draft=draft,
        prompt_tokens=tokens,
        settings=settings,
        repeats=plan.repeats,
        max_tokens=plan.max_tokens,
        machine_costs=machine,
        on_run=lambda: progress(None),
        cross=cross,
    )
    best = {t: best_fixed_k(settings, t) for t in plan.temperatures}
    pair_draft = target.pair.draft or draft.path  # load_models(need_draft=True) loaded it

    def store_target() -> None:
        tuning.store_measured(verify_key, list(profile))
        tuning.store_measured(draft_key, [machine.draft])
        for temperature, measurement in best.items():
            store_measurement(target.pair.verifier, pair_draft, temperature, measurement)

    result = {
        "pair": target.label,
        "verifier": str(target.pair.verifier),
        "placement": placement(verifier, draft),
        "where": where_line(verifier, draft),
        "draft": str(target.pair.draft),
        "draft_variant": None if choice is None else {"name": choice.name, "file": str(choice.path), "why": choice.why},
        # a draft of another vocabulary: the share of the verifier's tokens it can propose (None: the same vocabulary)
        "overlap": None if cross is None else round(cross.vocab_map.overlap, 4),
        "cross_mode": None if cross is None else cross.mode,
        "settings": [s.report() for s in settings],
        "best_k": {str(t): b.as_json() for t, b in best.items()},
        "verify_ms_by_batch": [round(seconds * 1000, 2) for seconds in machine.verify],
    }
    verifier.close()
    if draft is not None:
        draft.close()
    return result, machine, store_target


def check_plot_path(path: Path) -> None:
    """--plot: matplotlib is there and the PNG can be written where asked."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'specgguf[plot]'") from None
    existed = path.exists()
    try:
        with path.open("ab"):  # appending nothing: an existing plot is left as it is until replaced
            pass
    except OSError as error:
        raise UsageError(f"--plot {path}: cannot write a file there ({error.strerror or error})") from None
    if not existed:
        path.unlink()


def _table(result: dict) -> Table:
    mode = f" · another vocabulary, {result['cross_mode']} mode" if result.get("cross_mode") else ""
    table = Table(title=result["pair"] + mode, title_justify="left")
    overlap = result.get("overlap")
    for column in (
        "temp",
        "setting",
        "tok/s",
        "speedup (min–max)",
        "accept",
        *(("overlap",) if overlap is not None else ()),
        "tok/step",
        "accept by position",
        "draft/verify/other",
        "overhead",
    ):
        table.add_column(column, justify="left" if column in ("setting", "accept by position") else "right")
    for row in result["settings"]:
        speedup = (
            "1.00" if row["k"] == 0 else f"{row['speedup']:.2f} ({row['speedup_min']:.2f}–{row['speedup_max']:.2f})"
        )
        accept = "—" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.0%}"
        positions = " ".join(f"{a:.0%}" for a in row["acceptance_by_position"][:8])
        split = row["time_split"]
        table.add_row(
            f"{row['temperature']:g}",
            row["label"],
            f"{row['tokens_per_second']:.1f}",
            speedup,
            accept,
            *((f"{overlap:.0%}",) if overlap is not None else ()),
            f"{row['tokens_per_step']:.2f}",
            positions,
            f"{split['draft']:.0%}/{split['verify']:.0%}/{split['other']:.0%}",
            f"{row['overhead']:.1%}",
        )
    best = "; ".join(
        f"T={t}: " + (f"K={b['k']} ({b['speedup']:.2f}×)" if b["k"] else f"plain (best K only {b['speedup']:.2f}×)")
        for t, b in result["best_k"].items()
    )
    table.caption = f"best fixed K — {best}"
    return table


def _prompt_table(result: dict, kinds: list[str]) -> Table:
    """Speedup over plain per prompt (median over repeats): drafters win on different texts."""
    table = Table(title="speedup by prompt", title_justify="left")
    table.add_column("temp", justify="right")
    table.add_column("setting")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for row in result["settings"]:
        if row["k"] != 0:
            cells = [
                f"{row['speedup_by_prompt'][kind]:.2f}" if kind in row["speedup_by_prompt"] else "—" for kind in kinds
            ]
            table.add_row(f"{row['temperature']:g}", row["label"], *cells)
    return table


def save_plot(report: dict, path: Path) -> None:
    """Speedup vs K, one line per prompt kind, the plain baseline at 1.0 (fixed-K model drafts)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'specgguf[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(report["results"]), figsize=(6 * len(report["results"]), 4), squeeze=False)
    for ax, result in zip(axes[0], report["results"]):
        rows = [r for r in result["settings"] if r["drafter"] == "model" and isinstance(r["k"], int) and r["k"] > 0]
        for temperature in sorted({r["temperature"] for r in rows}):
            for kind in report["prompts"]:
                points = [(r["k"], r["speedup_by_prompt"].get(kind)) for r in rows if r["temperature"] == temperature]
                points = [(k, v) for k, v in points if v is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", label=f"{kind} (T={temperature:g})")
        ax.axhline(1.0, color="grey", linestyle="--", label="plain")
        ax.set(title=result["pair"], xlabel="K (draft tokens per step)", ylabel="speedup over plain")
        ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def parse_list(text: str, kind: type, option: str) -> list:
    try:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"{option} takes a comma-separated list, got {text!r}") from None
