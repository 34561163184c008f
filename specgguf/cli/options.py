"""The command line's shared options and their parsing into typed values (one definition each).

`cli` declares the commands; every option two commands share is an `Annotated` type here,
and each raw value becomes a typed one (`LoadOptions`, `DraftOptions`, `SamplingSettings`)
in one function, raising `UsageError`/`PromptError` that `cli.main` turns into one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ..core.cross_drafter import AUTO_CROSS_MODE
from ..core.drafters import DEFAULT_DRAFTER, DRAFTER_KINDS
from ..core.sampling import SamplingSettings
from ..errors import PromptError, UsageError, terminal_safe
from ..files.resolve import ResolvedPair
from ..llama.variants import parse_request, variants_help
from ..prepare import DraftOptions, LoadOptions

# --- options shared between commands (defined once) -------------------------------------
Model = Annotated[
    Path | None,
    typer.Option(
        "-m",
        "--model",
        help="Verifier: a GGUF file, a pair name, a pulled OWNER/REPO/FILE.gguf, ollama:NAME[:TAG] or"
        " lmstudio:PUBLISHER/REPO/FILE.gguf. Alone (no -md): a draft is found among the local models.",
        show_default=False,
    ),
]
ModelDraft = Annotated[
    Path | None,
    typer.Option("-md", "--model-draft", help="Draft: a reference as for -m.", show_default=False),
]
PairName = Annotated[str | None, typer.Option("--pair", help="A pair from models.yaml (see `pull`).")]
DraftMax = Annotated[
    str | None,
    typer.Option(
        "-k",
        "--draft-max",
        help="Draft tokens per step: a number (0 = verifier alone), 'adaptive' (chosen each "
        "step from measured costs) or 'auto' (default: the K `bench` stored for this pair here, else adaptive).",
    ),
]
Drafter = Annotated[
    str,
    typer.Option(
        "--drafter",
        help="; ".join(
            f"{spec.kind}{' (default)' if spec.kind == DEFAULT_DRAFTER else ''}: {spec.help}"
            for spec in DRAFTER_KINDS.values()
        )
        + ".",
    ),
]
DraftPMin = Annotated[
    float,
    typer.Option(
        "--draft-p-min", min=0.0, max=1.0, help="Stop drafting when the draft's top probability is below this."
    ),
]
DraftMin = Annotated[
    int, typer.Option("--draft-min", min=0, help="Draft at least this many tokens before --draft-p-min can stop it.")
]
CrossModeName = Annotated[
    str,
    typer.Option(
        "--cross-mode",
        help="A draft of another vocabulary: 'string' writes its own text, re-encoded by the verifier's "
        "tokenizer; 'tokens' proposes only the tokens both vocabularies share (both exact); 'auto' (default): "
        "whichever measured faster here for the pair (both measured once, kept in tuning.json).",
    ),
]
DraftVariantName = Annotated[str, typer.Option("--draft-variant", help=variants_help())]
ForceSpec = Annotated[bool, typer.Option("--force-spec", help="Keep speculating even where it measured slower.")]
DraftTree = Annotated[
    bool,
    typer.Option(
        "--draft-tree",
        help="Draft trees: with adaptive K, also check the draft's runner-up beside the chain where the "
        "measured costs say it pays (for verifiers that check extra tokens nearly free, e.g. GPUs).",
    ),
]
KeepNgrams = Annotated[
    bool,
    typer.Option(
        "--keep-ngrams",
        help="Keep the n-gram cache the ngram/hybrid drafters learn from across sessions (one file per "
        "verifier in the cache folder: read at start, saved at the end).",
    ),
]
Temperature = Annotated[float, typer.Option("--temp", min=0.0, help="Temperature; 0 = greedy.")]
TopK = Annotated[int, typer.Option("--top-k", min=0, help="Top-k (0 = off).")]
TopP = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Top-p (1 = off).")]
MinP = Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Min-p (0 = off).")]
Accept = Annotated[
    str,
    typer.Option(
        "--accept",
        help="How a chain of drafts is accepted when sampling: token (token by token) or block (jointly, Sun et al."
        " 2025: the same output law, never fewer drafts kept on average). Trees and --temp 0 are not affected.",
    ),
]
Seed = Annotated[int | None, typer.Option("--seed", help="RNG seed (default or -1: random, reported in --json).")]
CtxSize = Annotated[int, typer.Option("-c", "--ctx-size", min=16, help="Context size in tokens.")]
Threads = Annotated[int | None, typer.Option("-t", "--threads", min=1, help="CPU threads (default: all).")]
GpuLayers = Annotated[int, typer.Option("-ngl", "--n-gpu-layers", min=0, help="Verifier layers on the GPU.")]
GpuLayersDraft = Annotated[int, typer.Option("-ngld", "--n-gpu-layers-draft", min=0, help="Draft layers on the GPU.")]
Rpc = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        help="Put the verifier's layers on these `specgguf worker`s (or llama.cpp rpc-servers): "
        "HOST:PORT[,HOST:PORT...]; -ngl N sends only the last N (the output layer counts as one, as in "
        "llama.cpp).",
        show_default=False,
    ),
]
RpcDraft = Annotated[
    bool,
    typer.Option("--rpc-draft", help="Put the draft on the --rpc workers too (default: it stays on this machine)."),
]
RpcTimeout = Annotated[
    float,
    typer.Option("--rpc-timeout", min=0.1, help="Seconds an RPC worker may stay silent before the command gives up."),
]


def consoles(json_output: bool) -> tuple[Console | None, Console]:
    """A styled stdout console only on a terminal; stats always to stderr."""
    out_console = Console(highlight=False) if sys.stdout.isatty() and not json_output else None
    return out_console, Console(stderr=True, highlight=False)


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or standard input, as UTF-8 text (anything else is refused, not mangled)."""
    if prompt is not None and prompt != "-":
        text = prompt
    elif sys.stdin is None or sys.stdin.isatty():
        raise PromptError("no prompt: give it as an argument or on standard input")
    else:
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PromptError(
                f"standard input is not UTF-8 text (byte {data[error.start]:#04x} at offset"
                f" {error.start}); convert it first, e.g. with iconv -t UTF-8"
            ) from None
    try:
        text.encode("utf-8")  # an argument with undecodable bytes arrives with surrogate escapes
    except UnicodeEncodeError:
        raise PromptError("the prompt is not UTF-8 text; convert it first, e.g. with iconv -t UTF-8") from None
    return text


def parse_seed(seed: int | None) -> int | None:
    """--seed: a number >= 0, or -1 (as in llama.cpp) or nothing for a random one."""
    if seed is not None and seed < -1:
        raise UsageError(f"--seed must be >= 0, or -1 for a random seed; got {seed}")
    return None if seed == -1 else seed


def parse_threads(threads: int | None, err_console: Console) -> int | None:
    """-t: at most the cores this process may use (more only makes llama.cpp's threads wait on each other)."""
    from ..llama.threads import usable_cores

    usable = usable_cores()
    if threads is not None and threads > usable:
        err_console.print(f"-t {threads}: only {usable} cores are usable here; using {usable}", style="yellow")
        return usable
    return threads


def sampling_settings(temp: float, top_k: int, top_p: float, min_p: float, accept: str = "token") -> SamplingSettings:
    if accept not in ("token", "block"):
        raise UsageError(f"--accept must be token or block, got {accept!r}")
    try:
        return SamplingSettings(
            temperature=temp,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            acceptance="block" if accept == "block" else "token",
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def draft_options(
    draft_max: str | None,
    drafter: str,
    p_min: float,
    n_min: int,
    force_spec: bool,
    on_workers: bool = False,
    *,
    keep_ngrams: bool = False,
    trees: bool = False,
    cross_mode: str = AUTO_CROSS_MODE,
):
    from ..core.drafters import cross_mode_named, drafter_kind
    from ..kchoice import KChoice, parse_k

    kind = drafter_kind(drafter)
    mode = cross_mode_named(cross_mode)
    k = parse_k(draft_max)
    if on_workers and k.mode == "auto":
        k = KChoice("adaptive")  # the K `bench` stored was measured with the verifier here, not on workers
    return DraftOptions(
        k=k,
        drafter=kind,
        p_min=p_min,
        n_min=n_min,
        force_spec=force_spec,
        keep_ngrams=keep_ngrams,
        trees=trees,
        cross_mode=mode,
    )


def load_options(
    *,
    ctx_size: int,
    threads: int | None,
    rpc: str | None,
    rpc_draft: bool,
    rpc_timeout: float,
    err_console: Console,
    n_gpu_layers: int = 0,
    n_gpu_layers_draft: int = 0,
    draft_variant: str = "auto",
) -> LoadOptions:
    from ..llama.rpc import TOKEN_ENV, parse_workers

    workers = parse_workers(rpc) if rpc is not None else ()
    if token := os.environ.get(TOKEN_ENV):  # the workers' shared secret: from the environment, not the command line
        workers = tuple(dataclasses.replace(worker, token=token) for worker in workers)
    if rpc_draft and not workers:
        raise UsageError("--rpc-draft needs --rpc HOST:PORT")
    return LoadOptions(
        n_ctx=ctx_size,
        n_threads=parse_threads(threads, err_console),
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=workers,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        draft_variant=parse_request(draft_variant),
    )


def progress_bar(err_console: Console):
    """A Rich progress callback for assembling model files."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TransferSpeedColumn

    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err_console,
        transient=True,
    )
    tasks: dict[int, TaskID] = {}

    def on_progress(done: int, total: int) -> None:
        if total not in tasks:
            progress.start()
            tasks[total] = progress.add_task("assembling model", total=total)
        progress.update(tasks[total], completed=done)
        if done >= total:
            progress.stop()

    return on_progress


class ReaderGone(Exception):
    """stdout's reader closed the pipe (`| head -1`); not an OSError, so click leaves it to us."""


@contextlib.contextmanager
def reader_may_leave() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise ReaderGone from None


def pair_setup(
    *,
    model: Path | None,
    model_draft: Path | None,
    pair: str | None,
    draft_max: str | None,
    drafter: str,
    draft_p_min: float,
    draft_min: int,
    force_spec: bool,
    keep_ngrams: bool,
    draft_tree: bool,
    draft_variant: str,
    ctx_size: int,
    cross_mode: str = AUTO_CROSS_MODE,
    threads: int | None,
    n_gpu_layers: int,
    n_gpu_layers_draft: int,
    rpc: str | None,
    rpc_draft: bool,
    rpc_timeout: float,
    err_console: Console,
) -> tuple[ResolvedPair, LoadOptions, DraftOptions]:
    """What `run`, `chat` and `serve` share: the options checked, then the pair found (fetched or
    assembled if it must be, with a progress bar)."""
    from ..files.resolve import resolve_pair

    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
        draft_variant=draft_variant,
    )
    drafting = draft_options(
        draft_max,
        drafter,
        draft_p_min,
        draft_min,
        force_spec,
        bool(load.rpc),
        keep_ngrams=keep_ngrams,
        trees=draft_tree,
        cross_mode=cross_mode,
    )
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    if model is not None and model_draft is None and DRAFTER_KINDS[drafting.drafter].needs_model and not drafting.plain:
        resolved, drafting = found_draft(resolved, drafting, err_console)
    return resolved, load, drafting


def found_draft(
    resolved: ResolvedPair, drafting: DraftOptions, err_console: Console
) -> tuple[ResolvedPair, DraftOptions]:
    """-m without -md: a draft found among the local models (drafts/found.py; one of another vocabulary,
    drafts/cross_search.py, is measured before it is adopted), else n-grams alone; says which."""
    from ..drafts.cross_search import find_any_draft

    if not resolved.verifier.is_file():
        return resolved, drafting  # loading it says what is wrong
    choice = find_any_draft(resolved.verifier)
    if choice is None:
        return resolved, drafting  # llama.cpp cannot read it: loading it says why, in one line
    err_console.print(Text(terminal_safe(choice.message), style="dim"), soft_wrap=True)
    if choice.draft is None:
        return resolved, replace(drafting, drafter="ngram")
    pair = choice.pair
    return (
        replace(
            resolved,
            draft=choice.draft,
            name=pair.name if pair else None,
            recommended_k=pair.recommended_k if pair else None,
        ),
        replace(drafting, trial=choice.cross),
    )
