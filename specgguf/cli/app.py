"""The command line. Commands gather options and call keyword-only functions; errors become one line here.

Set SPECGGUF_DEBUG=1 to see tracebacks (and llama.cpp's own log).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.exceptions import TyperException

from ..core.drafters import DEFAULT_DRAFTER
from ..errors import CheckCouldNotRun, SpecggufError, UsageError, debug_enabled, terminal_safe
from .options import (
    CtxSize,
    Drafter,
    DraftMax,
    DraftMin,
    DraftPMin,
    DraftTree,
    ForceSpec,
    GpuLayers,
    GpuLayersDraft,
    KeepNgrams,
    MinP,
    Model,
    ModelDraft,
    PairName,
    Rpc,
    RpcDraft,
    RpcTimeout,
    Seed,
    Temperature,
    Threads,
    TopK,
    TopP,
    consoles,
    draft_options,
    load_options,
    parse_seed,
    progress_bar,
    read_prompt,
    sampling_settings,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Speculative decoding for llama.cpp GGUF models: the big model's answers, sooner.",
)


@app.callback()
def _root() -> None:
    """Speculative decoding for llama.cpp GGUF models: the big model's answers, sooner."""


class _ReaderGone(Exception):
    """stdout's reader closed the pipe (`| head -1`); not an OSError, so click leaves it to us."""


@contextlib.contextmanager
def _reader_may_leave():
    try:
        yield
    except BrokenPipeError:
        raise _ReaderGone from None


@app.command()
def run(
    prompt: Annotated[str | None, typer.Argument(help="The prompt; '-' or nothing reads standard input.")] = None,
    model: Model = None,
    model_draft: ModelDraft = None,
    pair: PairName = None,
    draft_max: DraftMax = None,
    drafter: Drafter = DEFAULT_DRAFTER,
    draft_p_min: DraftPMin = 0.0,
    draft_min: DraftMin = 0,
    force_spec: ForceSpec = False,
    keep_ngrams: KeepNgrams = False,
    draft_tree: DraftTree = False,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Tokens to generate.")] = 512,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    seed: Seed = None,
    ctx_size: CtxSize = 4096,
    threads: Threads = None,
    n_gpu_layers: GpuLayers = 0,
    n_gpu_layers_draft: GpuLayersDraft = 0,
    rpc: Rpc = None,
    rpc_draft: RpcDraft = False,
    rpc_timeout: RpcTimeout = 60.0,
    system: Annotated[str | None, typer.Option("--system", help="System prompt for the chat template.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    show_rejected: Annotated[bool, typer.Option("--show-rejected", help="Show rejected drafts, struck out.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No stats line on stderr.")] = False,
) -> None:
    """Answer one prompt with speculative decoding."""
    from ..files.resolve import resolve_pair
    from .run import run_prompt

    text = read_prompt(prompt)
    out_console, err_console = consoles(json_output)
    settings = sampling_settings(temp, top_k, top_p, min_p)
    seed = parse_seed(seed)  # checked before the models load
    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
    )
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    with _reader_may_leave():
        run_prompt(
            prompt=text,
            resolved=resolved,
            max_tokens=max_tokens,
            settings=settings,
            drafting=draft_options(
                draft_max,
                drafter,
                draft_p_min,
                draft_min,
                force_spec,
                bool(load.rpc),
                keep_ngrams=keep_ngrams,
                trees=draft_tree,
            ),
            seed=seed,
            load=load,
            raw=raw,
            system=system,
            json_output=json_output,
            show_rejected=show_rejected,
            quiet=quiet,
            out=sys.stdout,
            out_console=out_console,
            err_console=err_console,
        )


@app.command()
def bench(
    model: Model = None,
    model_draft: ModelDraft = None,
    pair: PairName = None,
    f16: Annotated[
        bool,
        typer.Option(
            "--f16",
            help="Also measure the pair with its verifier converted to F16 "
            "(memory-bound on a CPU; converted once into the cache).",
        ),
    ] = False,
    only_f16: Annotated[bool, typer.Option("--only-f16", help="Measure only the F16-verifier variant.")] = False,
    draft_max: Annotated[
        str | None, typer.Option("-k", "--draft-max", help="Fixed K values to sweep, e.g. 2,4,8.")
    ] = None,
    adaptive: Annotated[bool, typer.Option("--adaptive/--no-adaptive", help="Also measure adaptive K.")] = True,
    drafters: Annotated[str, typer.Option("--drafters", help="Drafters to measure: model,ngram,hybrid.")] = "model",
    temps: Annotated[
        str | None,
        typer.Option("--temps", help="Temperatures, e.g. 0,0.8 (default: 0,0.8; --quick: 0).", show_default=False),
    ] = None,
    prompts: Annotated[
        str | None,
        typer.Option(
            "--prompts",
            help="Prompts to run, from: code, prose, edit, "
            "chat, summary, repeat (default: all but prose; --quick: code,edit;"
            " --vs-llama-cpp: code,prose,edit,chat).",
        ),
    ] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", min=1, help="Repeats of the prompt set.")] = None,
    max_tokens: Annotated[int | None, typer.Option("-n", "--max-tokens", min=1, help="Tokens per run.")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Two prompts, K 4 and 8, greedy, one repeat, 48 tokens.")
    ] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Save speedup vs K as a PNG.")] = None,
    store: Annotated[bool, typer.Option("--store/--no-store", help="Store the best K for `-k auto`.")] = True,
    vs_llama_cpp: Annotated[
        Path | None,
        typer.Option(
            "--vs-llama-cpp",
            help="Compare with llama.cpp's own llama-completion and llama-speculative-simple in this"
            " directory (docs/llama-cpp.md): same prompts, threads, -n, temperatures, interleaved; ratios of tok/s."
            " Stores no K.",
            show_default=False,
        ),
    ] = None,
    ctx_size: CtxSize = 2048,
    threads: Threads = None,
    rpc: Rpc = None,
    rpc_draft: RpcDraft = False,
    rpc_timeout: RpcTimeout = 60.0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON report.")] = False,
) -> None:
    """Measure plain vs speculative decoding side by side and print the ratios."""
    from ..bench.command import BenchTarget, bench as run_benchmark, f16_variant, make_plan
    from ..files.resolve import resolve_pair

    _, err_console = consoles(json_output)
    tools = None
    if vs_llama_cpp is not None:
        from ..bench.llama_tools import LlamaTools
        from ..bench.vs_llama import compare, vs_plan

        if plot is not None or rpc:
            raise UsageError("--vs-llama-cpp runs both sides on this machine and draws no plot: drop --plot/--rpc")
        tools = LlamaTools.find(vs_llama_cpp)  # before minutes of loading, not after
    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
    )
    plan = make_plan(
        ks=draft_max,
        temps=temps,
        drafters=drafters,
        prompts=prompts,
        repeats=repeats,
        max_tokens=max_tokens,
        quick=quick,
        adaptive=adaptive,
        vs_llama_cpp=tools is not None,
    )
    comparison = vs_plan(plan) if tools is not None else None
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    if resolved.draft is None:
        raise UsageError("bench needs a draft model: give -md DRAFT or a --pair")
    target = BenchTarget(label=resolved.name or resolved.verifier.name, pair=resolved)
    targets = [f16_variant(target)] if only_f16 else [target] + ([f16_variant(target)] if f16 else [])
    if tools is not None and comparison is not None:
        compare(
            targets=targets,
            tools=tools,
            plan=comparison,
            load=load,
            json_output=json_output,
            out=sys.stdout,
            err_console=err_console,
        )
        return
    run_benchmark(
        targets=targets,
        plan=plan,
        load=load,
        json_output=json_output,
        plot=plot,
        store=store,
        out=sys.stdout,
        err_console=err_console,
    )


@app.command()
def pull(
    pair: Annotated[
        str | None, typer.Argument(help="A pair from `specgguf pairs` (default: the default pair).", show_default=False)
    ] = None,
    verifier: Annotated[
        str | None, typer.Option("--verifier", help="Ad-hoc pair: the verifier, OWNER/REPO/FILE.gguf on Hugging Face.")
    ] = None,
    draft: Annotated[str | None, typer.Option("--draft", help="Ad-hoc pair: the draft, OWNER/REPO/FILE.gguf.")] = None,
) -> None:
    """Download a matched pair into the Hugging Face cache (resumable, SHA-256 verified), then check it pairs.

    Progress goes to stderr; the two local paths (verifier, draft) to stdout.
    Honours HF_ENDPOINT, HF_HOME/HF_HUB_CACHE and HF_HUB_OFFLINE=1.
    """
    from .pull import pull as pull_pair

    pull_pair(
        pair_name=pair,
        verifier=verifier,
        draft=draft,
        err_console=Console(stderr=True, highlight=False, soft_wrap=True),
        out=sys.stdout,
    )


@app.command()
def pairs(
    name: Annotated[str | None, typer.Argument(help="Show this pair in full.", show_default=False)] = None,
) -> None:
    """The registry's pairs: sizes, whether they are here, recommended K, and what was measured here."""
    from .pairs import show_pairs

    with _reader_may_leave():
        show_pairs(name=name, console=Console(highlight=False))


@app.command()
def check(
    draft: Annotated[
        str,
        typer.Argument(
            help="The draft: a GGUF path, a pair name (its draft) or a pulled OWNER/REPO/FILE.gguf.", show_default=False
        ),
    ],
    verifier: Annotated[
        str,
        typer.Argument(
            help="The verifier: a GGUF path, a pair name (its verifier) or a pulled OWNER/REPO/FILE.gguf.",
            show_default=False,
        ),
    ],
) -> None:
    """Explain, item by item, whether DRAFT can draft for VERIFIER.

    Exit status: 0 they can be paired, 1 they cannot, 2 the check could not run (missing file, ...).
    """
    from .check import check_pair, render_report

    try:
        report = check_pair(draft=draft, verifier=verifier)
    except SpecggufError as error:
        raise CheckCouldNotRun(str(error)) from error
    with _reader_may_leave():
        render_report(report, Console(highlight=False, soft_wrap=True))
    if not report.compatible:
        raise typer.Exit(1)


@app.command()
def chat(
    model: Model = None,
    model_draft: ModelDraft = None,
    pair: PairName = None,
    draft_max: DraftMax = None,
    drafter: Drafter = DEFAULT_DRAFTER,
    draft_p_min: DraftPMin = 0.0,
    draft_min: DraftMin = 0,
    force_spec: ForceSpec = False,
    keep_ngrams: KeepNgrams = False,
    draft_tree: DraftTree = False,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Most tokens per answer.")] = 1024,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    seed: Seed = None,
    ctx_size: CtxSize = 4096,
    threads: Threads = None,
    n_gpu_layers: GpuLayers = 0,
    n_gpu_layers_draft: GpuLayersDraft = 0,
    rpc: Rpc = None,
    rpc_draft: RpcDraft = False,
    rpc_timeout: RpcTimeout = 60.0,
    system: Annotated[str | None, typer.Option("--system", help="System prompt for the chat template.")] = None,
    show_rejected: Annotated[bool, typer.Option("--show-rejected", help="Show rejected drafts, struck out.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No stats line after each answer.")] = False,
) -> None:
    """Talk with the pair: each turn evaluates only its new tokens. Piped input: one answer per line."""
    from ..files.resolve import resolve_pair
    from .chat import run_chat

    out_console, err_console = consoles(False)
    settings = sampling_settings(temp, top_k, top_p, min_p)
    seed = parse_seed(seed)
    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
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
    )
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    with _reader_may_leave():
        run_chat(
            resolved=resolved,
            drafting=drafting,
            max_tokens=max_tokens,
            settings=settings,
            seed=seed,
            load=load,
            system=system,
            show_rejected=show_rejected,
            quiet=quiet,
            stdin=sys.stdin,
            out=sys.stdout,
            out_console=out_console,
            err_console=err_console,
        )


@app.command()
def serve(
    model: Model = None,
    model_draft: ModelDraft = None,
    pair: PairName = None,
    draft_max: DraftMax = None,
    drafter: Drafter = DEFAULT_DRAFTER,
    draft_p_min: DraftPMin = 0.0,
    draft_min: DraftMin = 0,
    force_spec: ForceSpec = False,
    keep_ngrams: KeepNgrams = False,
    draft_tree: DraftTree = False,
    max_tokens: Annotated[
        int,
        typer.Option("-n", "--max-tokens", min=1, help="Most tokens per answer when a request gives no max_tokens."),
    ] = 512,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    ctx_size: CtxSize = 4096,
    threads: Threads = None,
    n_gpu_layers: GpuLayers = 0,
    n_gpu_layers_draft: GpuLayersDraft = 0,
    rpc: Rpc = None,
    rpc_draft: RpcDraft = False,
    rpc_timeout: RpcTimeout = 60.0,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="SPECGGUF_API_KEY", show_envvar=True, help="Require 'Authorization: Bearer KEY'."
        ),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback --host without an API key.")
    ] = False,
    queue_size: Annotated[
        int, typer.Option("--queue-size", min=1, help="Requests that may wait for the generator; more get 503.")
    ] = 16,
    max_body: Annotated[
        int, typer.Option("--max-body", min=1024, help="Largest request body in bytes; larger gets 413.")
    ] = 1 << 20,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...).

    Sampling and drafting options are the defaults; each request may override them.
    """
    from ..files.resolve import resolve_pair
    from ..serve.app import check_address, run_server

    check_address(host, api_key=api_key, insecure=insecure)  # before a pair is fetched or loaded
    _, err_console = consoles(False)
    settings = sampling_settings(temp, top_k, top_p, min_p)
    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
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
    )
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    run_server(
        resolved=resolved,
        drafting=drafting,
        settings=settings,
        max_tokens=max_tokens,
        load=load,
        host=host,
        port=port,
        api_key=api_key,
        insecure=insecure,
        queue_size=queue_size,
        max_body_bytes=max_body,
        err_console=err_console,
    )


@app.command()
def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="IPv4 address to listen on; anything but loopback is reachable by others (no authentication).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 50052,
    threads: Annotated[
        int | None, typer.Option("-t", "--threads", min=1, help="CPU threads (default: half the cores).")
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache",
            help="Keep received weights in this folder, so a client loading the same model again sends only hashes.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve this machine's CPU (or GPUs) to `--rpc` clients: llama.cpp's RPC server, as its `rpc-server` runs it.

    Ctrl-C stops it (exit status 130), SIGTERM too (0).
    """
    from .worker import exit_now, serve

    exit_now(
        serve(
            host=host,
            port=port,
            n_threads=threads,
            cache_dir=cache,
            err_console=Console(stderr=True, highlight=False, soft_wrap=True),
        )
    )


def _fail(message: str, code: int) -> int:
    if sys.stderr is not None:
        sys.stderr.write(f"specgguf: error: {terminal_safe(message)}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure is one line on stderr and a non-zero exit code."""
    debug = debug_enabled()
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        return _fail("standard output is closed; redirect it instead (e.g. >/dev/null)", 2)
    try:
        # Without standalone mode, typer *returns* the code of a `typer.Exit` (and 130 for Ctrl-C).
        code = app(args=argv, prog_name="specgguf", standalone_mode=False)
        if code == 130:
            return _fail("interrupted", 130)
        return code if isinstance(code, int) else 0
    except SpecggufError as error:
        if debug:
            raise
        return _fail(str(error), error.exit_code)
    except typer.Exit as exit_:
        return exit_.exit_code
    except typer.Abort:
        return _fail("interrupted", 130)
    except TyperException as error:  # bad options: typer's (click's) message, on one line
        return _fail(error.format_message().replace("\n", " "), getattr(error, "exit_code", 2))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except (_ReaderGone, BrokenPipeError):
        # The reader went away (`| head -1`): stop quietly, and keep Python's
        # own flush at exit from complaining about the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as error:
        if debug:
            raise
        return _fail(str(error), 1)


if __name__ == "__main__":
    sys.exit(main())
