"""The other commands: `bench`, `pull`, `pairs`, `check` and `worker`, each a thin shell over one module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..core.cross_drafter import AUTO_CROSS_MODE
from ..errors import CheckCouldNotRun, SpecggufError, UsageError
from .options import (
    CrossModeName,
    CtxSize,
    DraftVariantName,
    Model,
    ModelDraft,
    PairName,
    Rpc,
    RpcDraft,
    RpcTimeout,
    Threads,
    consoles,
    draft_options,
    found_draft,
    load_options,
    progress_bar,
    reader_may_leave,
)


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
    llama_cpp_huge_pages: Annotated[
        bool,
        typer.Option(
            "--llama-cpp-huge-pages",
            help="With --vs-llama-cpp: run llama.cpp's programs with the huge pages and load mode specgguf"
            " gives itself (default: as users run them; docs/llama-cpp.md).",
        ),
    ] = False,
    suite: Annotated[
        bool,
        typer.Option(
            "--suite",
            help="With --vs-llama-cpp: the benchmark suite's prompts of every kind (docs/llama-cpp.md),"
            " a row each, with the CPU and llama-bench's verify curve; --prompts then picks suite prompts"
            " by name or kind.",
        ),
    ] = False,
    ctx_size: CtxSize = 2048,
    threads: Threads = None,
    rpc: Rpc = None,
    rpc_draft: RpcDraft = False,
    rpc_timeout: RpcTimeout = 60.0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON report.")] = False,
    draft_variant: DraftVariantName = "auto",
    cross_mode: CrossModeName = AUTO_CROSS_MODE,
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
        tools = LlamaTools.find(vs_llama_cpp, same_pages=llama_cpp_huge_pages)  # before minutes of loading
    elif llama_cpp_huge_pages:
        raise UsageError("--llama-cpp-huge-pages goes with --vs-llama-cpp DIR")
    if suite and tools is None:
        raise UsageError("--suite goes with --vs-llama-cpp DIR")
    load = load_options(
        ctx_size=ctx_size,
        threads=threads,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
        draft_variant=draft_variant,
    )
    plan = make_plan(
        ks=draft_max,
        temps=temps,
        drafters=drafters,
        prompts=None if suite else prompts,  # with --suite: the suite's prompts by name
        repeats=repeats,
        max_tokens=max_tokens,
        quick=quick,
        adaptive=adaptive,
        vs_llama_cpp=tools is not None,
        cross_mode=cross_mode,
    )
    comparison = None
    if tools is not None:
        from ..bench.suite import load_suite, select

        comparison = vs_plan(plan, select(load_suite(), prompts) if suite else None)
    resolved = resolve_pair(model=model, model_draft=model_draft, pair=pair, on_progress=progress_bar(err_console))
    if resolved.draft is None and model is not None:
        resolved, _ = found_draft(resolved, draft_options(None, "model", 0.0, 0, False), err_console)
    if resolved.draft is None:
        raise UsageError("bench needs a draft model: give -md DRAFT or a --pair")
    target = BenchTarget(label=resolved.name or resolved.label or resolved.verifier.name, pair=resolved)
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
        store=store and cross_mode == AUTO_CROSS_MODE,  # `-k auto` reads one K per pair: the chosen mode's
        out=sys.stdout,
        err_console=err_console,
    )


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


def pairs(
    name: Annotated[str | None, typer.Argument(help="Show this pair in full.", show_default=False)] = None,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Every compatible draft/verifier pair among the models on this machine (specgguf's and the"
            " Hugging Face cache, Ollama, LM Studio): sizes, size ratio, the command to run it.",
        ),
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="With --local: one JSON list.")] = False,
) -> None:
    """The registry's pairs: sizes, whether they are here, recommended K, and what was measured here."""
    from .pairs import show_local_pairs, show_pairs

    if json_output and not local:
        raise UsageError("--json goes with --local")
    if local and name is not None:
        raise UsageError("--local lists every local pair: give no pair name with it")
    with reader_may_leave():
        if local:
            show_local_pairs(json_output=json_output, console=Console(highlight=False), out=sys.stdout)
        else:
            show_pairs(name=name, console=Console(highlight=False))


def check(
    draft: Annotated[
        str,
        typer.Argument(
            help="The draft: a GGUF path, a pair name (its draft), a pulled OWNER/REPO/FILE.gguf,"
            " ollama:NAME[:TAG] or lmstudio:PUBLISHER/REPO/FILE.gguf.",
            show_default=False,
        ),
    ],
    verifier: Annotated[
        str,
        typer.Argument(
            help="The verifier: a GGUF path, a pair name (its verifier), a pulled OWNER/REPO/FILE.gguf,"
            " ollama:NAME[:TAG] or lmstudio:PUBLISHER/REPO/FILE.gguf.",
            show_default=False,
        ),
    ],
) -> None:
    """Explain, item by item, whether DRAFT can draft for VERIFIER.

    Exit status: 0 they can be paired (one vocabulary, or drafting across vocabularies through the
    text), 1 they cannot, 2 the check could not run (missing file, ...).
    """
    from .check import check_pair, render_report

    try:
        report = check_pair(draft=draft, verifier=verifier)
    except SpecggufError as error:
        raise CheckCouldNotRun(str(error)) from error
    with reader_may_leave():
        render_report(report, Console(highlight=False, soft_wrap=True))
    if not report.pairs:
        raise typer.Exit(1)


def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="IPv4 address to listen on; anything but loopback is reachable by others (see --token).",
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
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="SPECGGUF_WORKER_TOKEN",
            help="Serve only clients that present this shared secret (theirs: SPECGGUF_WORKER_TOKEN).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve this machine's CPU (or GPUs) to `--rpc` clients: llama.cpp's RPC server, behind a relay that checks
    every request (and the --token).

    Ctrl-C stops it (exit status 130), SIGTERM too (0).
    """
    from .worker import exit_now, serve

    exit_now(
        serve(
            host=host,
            port=port,
            n_threads=threads,
            cache_dir=cache,
            token=token,
            err_console=Console(stderr=True, highlight=False, soft_wrap=True),
        )
    )
