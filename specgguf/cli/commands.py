"""The commands that generate: `run`, `chat` and `serve`. Each gathers its options, turns them into
typed values once (options.pair_setup), and calls one keyword-only function."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..core.cross_drafter import AUTO_CROSS_MODE
from ..core.drafters import DEFAULT_DRAFTER
from .options import (
    Accept,
    CrossModeName,
    CtxSize,
    Drafter,
    DraftMax,
    DraftMin,
    DraftPMin,
    DraftTree,
    DraftVariantName,
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
    pair_setup,
    parse_seed,
    read_prompt,
    reader_may_leave,
    sampling_settings,
)


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
    draft_variant: DraftVariantName = "auto",
    cross_mode: CrossModeName = AUTO_CROSS_MODE,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Tokens to generate.")] = 512,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    accept: Accept = "token",
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
    special: Annotated[
        bool,
        typer.Option(
            "--special/--no-special",
            help="With --raw: parse special tokens (<|im_start|>...) in the prompt, as llama.cpp's programs do.",
        ),
    ] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    show_rejected: Annotated[bool, typer.Option("--show-rejected", help="Show rejected drafts, struck out.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No stats line on stderr.")] = False,
    json_schema: Annotated[
        Path | None, typer.Option("--json-schema", help="Answer JSON that validates against this schema file.")
    ] = None,
    grammar: Annotated[
        Path | None, typer.Option("--grammar", help="Answer text that follows this GBNF (or Lark) grammar file.")
    ] = None,
) -> None:
    """Answer one prompt with speculative decoding."""
    from ..grammar import grammar_from_files
    from .run import run_prompt

    text = read_prompt(prompt)
    constraint = grammar_from_files(json_schema=json_schema, grammar=grammar)  # checked before the models load
    out_console, err_console = consoles(json_output)
    settings = sampling_settings(temp, top_k, top_p, min_p, accept)
    seed = parse_seed(seed)  # checked before the models load
    resolved, load, drafting = pair_setup(
        model=model,
        model_draft=model_draft,
        pair=pair,
        draft_max=draft_max,
        drafter=drafter,
        draft_p_min=draft_p_min,
        draft_min=draft_min,
        force_spec=force_spec,
        keep_ngrams=keep_ngrams,
        draft_tree=draft_tree,
        draft_variant=draft_variant,
        cross_mode=cross_mode,
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
    )
    with reader_may_leave():
        run_prompt(
            prompt=text,
            resolved=resolved,
            max_tokens=max_tokens,
            settings=settings,
            drafting=drafting,
            seed=seed,
            load=load,
            raw=raw,
            special=special,
            system=system,
            json_output=json_output,
            show_rejected=show_rejected,
            quiet=quiet,
            grammar=constraint,
            out=sys.stdout,
            out_console=out_console,
            err_console=err_console,
        )


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
    draft_variant: DraftVariantName = "auto",
    cross_mode: CrossModeName = AUTO_CROSS_MODE,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Most tokens per answer.")] = 1024,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    accept: Accept = "token",
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
    from .chat import run_chat

    out_console, err_console = consoles(False)
    settings = sampling_settings(temp, top_k, top_p, min_p, accept)
    seed = parse_seed(seed)
    resolved, load, drafting = pair_setup(
        model=model,
        model_draft=model_draft,
        pair=pair,
        draft_max=draft_max,
        drafter=drafter,
        draft_p_min=draft_p_min,
        draft_min=draft_min,
        force_spec=force_spec,
        keep_ngrams=keep_ngrams,
        draft_tree=draft_tree,
        draft_variant=draft_variant,
        cross_mode=cross_mode,
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
    )
    with reader_may_leave():
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
    draft_variant: DraftVariantName = "auto",
    cross_mode: CrossModeName = AUTO_CROSS_MODE,
    max_tokens: Annotated[
        int,
        typer.Option("-n", "--max-tokens", min=1, help="Most tokens per answer when a request gives no max_tokens."),
    ] = 512,
    temp: Temperature = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    accept: Accept = "token",
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
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-hosts",
            help="Host header values to answer besides the bound address and localhost (name, name:port, or '*').",
        ),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            envvar="SPECGGUF_ORIGINS",
            show_envvar=True,
            help="A browser origin (http://site:port, or '*') whose pages may call the API; repeat or comma-separate.",
        ),
    ] = None,
    strict_model: Annotated[
        bool,
        typer.Option("--strict-model", help="A request naming another model gets 404 (else any name means this one)."),
    ] = False,
    cache_slots: Annotated[
        int,
        typer.Option(
            "--cache-slots",
            min=1,
            max=64,
            help="Conversations whose caches are kept (parked as saved state, LRU) with --parallel 1;"
            " with more, the live sequences are the cached conversations.",
        ),
    ] = 4,
    parallel: Annotated[
        int | None,
        typer.Option(
            "--parallel",
            "-np",
            min=1,
            max=64,
            help="Requests answered at once, each in a KV sequence of its own, their batches decoded together"
            " (default: as many as half the free memory holds, 2 to 4). 1: one at a time, draft trees allowed.",
        ),
    ] = None,
    no_webui: Annotated[
        bool, typer.Option("--no-webui", help="Serve no chat page at / (it is a 404); the APIs stay.")
    ] = False,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic",
            help="Each request's rows go in passes of their own, its prompt read whole and its K chosen from its"
            " own tokens: the same greedy request gets the same answer whatever else runs (slower under load).",
        ),
    ] = False,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...).

    Sampling and drafting options are the defaults; each request may override them.
    """
    from ..serve.app import check_address, run_server
    from ..serve.guard import check_api_key, parse_hosts, parse_origins

    api_key = check_api_key(api_key)  # all before a pair is fetched or loaded
    check_address(host, api_key=api_key, insecure=insecure)
    hosts, origins = parse_hosts(allowed_hosts), parse_origins(cors_origin)
    _, err_console = consoles(False)
    settings = sampling_settings(temp, top_k, top_p, min_p, accept)
    resolved, load, drafting = pair_setup(
        model=model,
        model_draft=model_draft,
        pair=pair,
        draft_max=draft_max,
        drafter=drafter,
        draft_p_min=draft_p_min,
        draft_min=draft_min,
        force_spec=force_spec,
        keep_ngrams=keep_ngrams,
        draft_tree=draft_tree,
        draft_variant=draft_variant,
        cross_mode=cross_mode,
        ctx_size=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        rpc=rpc,
        rpc_draft=rpc_draft,
        rpc_timeout=rpc_timeout,
        err_console=err_console,
    )
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
        allowed_hosts=hosts,
        cors_origins=origins,
        strict_model=strict_model,
        cache_slots=cache_slots,
        parallel=parallel,
        webui=not no_webui,
        deterministic=deterministic,
    )
