"""`specgguf pairs`: the registry at a glance, with what is on this machine and what was measured here.

"Measured" is what `specgguf bench` stored for the pair on this machine (tuning.py):
the acceptance rate, the speedup over plain decoding and the best K, greedy if stored.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import terminal_safe
from ..files.local_models import LocalModel
from ..files.registry import ModelFile, Pair, Registry, load_registry
from ..files.resolve import find_local
from ..files.stamps import size_text
from ..tuning import BenchResult, stored_measurement

if TYPE_CHECKING:  # imported where `pairs --local` runs: the scan's modules load only for it
    from ..drafts.cross_search import CrossPair
    from ..drafts.found import LocalPair


def measurement(pair: Pair) -> tuple[BenchResult, str] | None:
    """The bench result stored for this pair here (greedy first), and at which temperature."""
    for temperature, label in ((0.0, ""), (1.0, " (sampled)")):
        stored = stored_measurement(Path(pair.verifier.file), Path(pair.draft.file), temperature)
        if stored is not None:
            return stored, label
    return None


def is_local(model: ModelFile) -> bool:
    """On disk, or installed as PyPI chunk packages (assembled on first use, no pull needed)."""
    if find_local(model) is not None:
        return True
    return model.pypi is not None and model.pypi.installed()


def _bytes(model: ModelFile) -> int | None:
    if model.total_size is not None:
        return model.total_size
    local = find_local(model)
    return local.stat().st_size if local is not None and not model.shards else None


def _sizes(pair: Pair) -> str:
    """Verifier + draft in GB, '?' where the registry does not know and the file is not here."""
    sizes = [_bytes(pair.verifier), _bytes(pair.draft)]
    return "+".join(
        "?" if size is None else f"{size / 1e9:.2f}" if size < 1e10 else f"{size / 1e9:.1f}" for size in sizes
    )


def _short(model: ModelFile) -> str:
    name = model.repo.split("/")[-1]
    for suffix in ("-GGUF", "-gguf", "-Instruct"):
        name = name.removesuffix(suffix)
    return name


def _here(pair: Pair) -> Text:
    verifier, draft = is_local(pair.verifier), is_local(pair.draft)
    if verifier and draft:
        return Text("yes", style="green")
    return Text("verifier" if verifier else "draft" if draft else "no", style="yellow" if verifier or draft else "")


def _measured(pair: Pair) -> str:
    found = measurement(pair)
    if found is None:
        return "-"
    stored, label = found
    if not stored.k:
        return f"plain faster ({stored.speedup:.2f}x){label}"
    accepted = "-" if stored.acceptance_rate is None else f"{stored.acceptance_rate:.0%}"
    return f"{accepted}, {stored.speedup:.2f}x, K={stored.k}{label}"


def pairs_table(registry: Registry) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("pair", no_wrap=True)
    table.add_column("draft", no_wrap=True)
    table.add_column("GB", justify="right", no_wrap=True)
    table.add_column("K", justify="right")
    table.add_column("here", no_wrap=True)
    table.add_column("measured", overflow="fold")
    for pair in registry.pairs.values():
        unconfirmed = not (pair.verifier.confirmed and pair.draft.confirmed)
        name = Text(
            terminal_safe(pair.name) + (" *" if pair.name == registry.default else "") + (" !" if unconfirmed else "")
        )
        table.add_row(
            name, Text(_short(pair.draft)), _sizes(pair), str(pair.recommended_k), _here(pair), _measured(pair)
        )
    return table


def pair_details(pair: Pair, registry: Registry) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    default = " (default)" if pair.name == registry.default else ""
    table.add_row(Text("pair", style="bold"), Text(terminal_safe(pair.name) + default))
    table.add_row(Text("note", style="bold"), Text(terminal_safe(pair.note)))
    table.add_row(Text("licence", style="bold"), Text(terminal_safe(pair.license)))
    table.add_row(Text("K", style="bold"), Text(str(pair.recommended_k)))
    for role, model in (("verifier", pair.verifier), ("draft", pair.draft)):
        local = find_local(model)
        lines = [
            model.ref + ("" if model.confirmed else "  (not confirmed against a source)"),
            f"revision {model.revision or 'main'}, {size_text(_bytes(model))}"
            + (f", {len(model.shards) + 1} parts" if model.shards else "")
            + (f", sha256 {model.sha256}" if model.sha256 else ""),
            f"here: {local}"
            if local
            else ("here: PyPI packages installed" if is_local(model) else f"not here: specgguf pull {pair.name}"),
        ]
        table.add_row(Text(role, style="bold"), Text("\n".join(lines)))
    table.add_row(Text("measured", style="bold"), Text(_measured(pair) + " (specgguf bench stores it)"))
    return table


def show_pairs(*, name: str | None, console: Console) -> None:
    registry = load_registry()
    if name is not None:
        console.print(pair_details(registry.get(name), registry))
        return
    console.print(pairs_table(registry))
    footer = "*: the default pair. `specgguf pairs NAME` shows a pair in full; `specgguf pull NAME` downloads it."
    if any(not (pair.verifier.confirmed and pair.draft.confirmed) for pair in registry.pairs.values()):
        footer += " !: a file not confirmed against a source."
    console.print(Text(footer, style="dim"))


# --- `pairs --local`: its rows (a table, a command line each, --json) ---
def _command(verifier: LocalModel, draft: LocalModel) -> str:
    return f"specgguf run -m {shlex.quote(verifier.ref)} -md {shlex.quote(draft.ref)}"


def _sizes_here(verifier_size: int, draft_size: int) -> str:
    return f"{size_text(verifier_size)} + {size_text(draft_size)}"


def _cross_why(cross: CrossPair) -> str:
    measured = cross.draft.measured
    return cross.draft.why + ("" if measured is None else f"; measured here: {measured.describe()}")


def _same_row(pair: LocalPair) -> dict:
    return {
        "verifier": pair.verifier.ref,
        "draft": pair.draft.ref,
        "verifier_path": str(pair.verifier.path),
        "draft_path": str(pair.draft.path),
        "verifier_bytes": pair.verifier_size,
        "draft_bytes": pair.draft_size,
        "ratio": round(pair.ratio, 4),
        "command": _command(pair.verifier, pair.draft),
        "vocabulary": "same",
    }


def _other_row(cross: CrossPair) -> dict:
    measured = cross.draft.measured
    return {
        "verifier": cross.verifier.ref,
        "draft": cross.draft.model.ref,
        "verifier_path": str(cross.verifier.path),
        "draft_path": str(cross.draft.model.path),
        "verifier_bytes": cross.verifier_size,
        "draft_bytes": cross.draft.size,
        "ratio": round(cross.draft.size / cross.verifier_size, 4),
        "vocabulary": "other",
        "overlap": round(cross.draft.overlap, 4),
        # the mode it drafts in (the faster measured here), with each measured mode's trial
        "measured": None
        if measured is None
        else measured.trial.as_json()
        | {"adopted": measured.trial.adopted, "mode": measured.mode}
        | {"modes": {mode: trial.as_json() for mode, trial in measured.trials.items()}},
        "command": _command(cross.verifier, cross.draft.model),
        "why": _cross_why(cross),
    }


def show_local_pairs(*, json_output: bool, console: Console, out: TextIO) -> None:
    """`pairs --local`: every pair among the local files, smallest ratio first per verifier; then the
    drafts of another vocabulary (drafts/cross_search.py), ranked after them, each with its overlap."""
    from ..core.cross_drafter import CROSS_MODE_NAMES
    from ..drafts.cross_search import all_local_pairs
    from ..drafts.found import MAX_RATIO

    found, crosses = all_local_pairs()
    if json_output:
        rows = [_same_row(pair) for pair in found] + [_other_row(cross) for cross in crosses]
        out.write(json.dumps(rows, ensure_ascii=False) + "\n")
        return
    if not found and not crosses:
        console.print(
            "no two local models share a vocabulary, and none of another vocabulary is small enough to draft"
            " for another (looked in specgguf's cache, the Hugging Face cache, Ollama's store and LM Studio's folder)"
        )
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("verifier", "draft", "sizes", "ratio", "vocabulary"):
        table.add_column(column, justify="right" if column == "ratio" else "left", overflow="fold")
    for pair in found:
        table.add_row(
            Text(terminal_safe(pair.verifier.ref)),
            Text(terminal_safe(pair.draft.ref)),
            _sizes_here(pair.verifier_size, pair.draft_size),
            Text(f"{pair.ratio:.0%}", style="green" if pair.ratio <= MAX_RATIO else ""),
            "same",
        )
    for cross in crosses:
        measured = cross.draft.measured
        verdict = (
            ""
            if measured is None
            else f", {CROSS_MODE_NAMES[measured.mode]} measured faster than n-grams"
            if measured.trial.adopted
            else ", measured slower"
        )
        table.add_row(
            Text(terminal_safe(cross.verifier.ref)),
            Text(terminal_safe(cross.draft.model.ref)),
            _sizes_here(cross.verifier_size, cross.draft.size),
            f"{cross.draft.size / cross.verifier_size:.0%}",
            f"other: {cross.draft.overlap:.0%} shared{verdict}",
        )
    console.print(table)
    console.print()
    for pair in found:
        console.print(Text(terminal_safe(_command(pair.verifier, pair.draft))), soft_wrap=True)
    for cross in crosses:
        console.print(Text(terminal_safe(_command(cross.verifier, cross.draft.model))), soft_wrap=True)
        console.print(Text(f"  {terminal_safe(_cross_why(cross))}", style="dim"), soft_wrap=True)
    console.print(
        Text(
            "ratio: the draft's size over the verifier's (green: at most ~1/4, what `-m VERIFIER` alone"
            " picks). Each same-vocabulary pair passed llama.cpp's vocabulary rules on the files' headers; run"
            " checks again. A draft of another vocabulary drafts through text: its own re-encoded by the verifier"
            " (string-level) or only the shared tokens, whichever measured faster here (both exact; `--cross-mode`"
            " names one); `-m VERIFIER` alone tries"
            " one only after those that share the vocabulary, and uses it only where measured here to beat"
            " n-gram drafts alone.",
            style="dim",
        )
    )
