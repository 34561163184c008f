"""`specgguf run`: one prompt in, the verifier's answer out, sooner."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import TextIO

import numpy as np
from rich.console import Console
from rich.text import Text

from . import verify_costs
from .drafting import build_drafter
from .engine import speculate
from .errors import PromptError
from .render import TokenStream, legend
from .resolve import ResolvedPair
from .rpc import DEFAULT_TIMEOUT, RpcWorker
from .sampling import SamplingSettings
from .stats import GenerationStats
from .tuning import KChoice, make_policy


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    rpc: tuple[RpcWorker, ...] = ()  # the verifier's layers go to these workers
    rpc_draft: bool = False  # ... and the draft's too
    rpc_timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class DraftOptions:
    k: KChoice = field(default_factory=lambda: KChoice("auto"))
    drafter: str = "model"  # "model", "ngram" (prompt lookup, no draft model) or "hybrid"
    p_min: float = 0.0  # early stop: the draft stops below this top probability
    n_min: int = 0  # ... but only after this many drafts
    force_spec: bool = False  # never fall back to plain decoding


def load_models(resolved: ResolvedPair, options: LoadOptions, *, need_draft: bool):
    """Load the verifier and (if drafting) the draft, refusing pairs llama.cpp would refuse."""
    from .backend import LlamaModel  # llama.cpp loads only when a command needs it
    from .compat import ensure_compatible

    verifier = LlamaModel(resolved.verifier, n_ctx=options.n_ctx, n_threads=options.n_threads,
                          n_gpu_layers=options.n_gpu_layers, rpc_workers=options.rpc, rpc_timeout=options.rpc_timeout)
    if not need_draft or resolved.draft is None:
        return verifier, None
    draft = LlamaModel(resolved.draft, n_ctx=options.n_ctx, n_threads=options.n_threads,
                       n_gpu_layers=options.n_gpu_layers_draft, rpc_workers=options.rpc if options.rpc_draft else (),
                       rpc_timeout=options.rpc_timeout)
    ensure_compatible(verifier.vocab_info(), draft.vocab_info())
    return verifier, draft


def prompt_tokens(verifier, prompt: str, *, raw: bool, system: str | None) -> list[int]:
    """The verifier's chat template around the prompt (unless raw or the model has none)."""
    if not prompt.strip():
        raise PromptError("the prompt is empty")
    if raw or verifier.chat_template() is None:
        return verifier.tokenize(prompt, special=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return verifier.tokenize(verifier.apply_chat_template(messages), special=True)


def run_prompt(*, prompt: str, resolved: ResolvedPair, drafting: DraftOptions, max_tokens: int,
               settings: SamplingSettings, seed: int | None, load: LoadOptions, raw: bool = False,
               system: str | None = None, json_output: bool = False, show_rejected: bool = False,
               quiet: bool = False, out: TextIO, out_console: Console | None, err_console: Console) -> dict:
    """Generate one answer; stream it (or print one JSON object) and report stats on stderr."""
    seed = seed if seed is not None else secrets.randbelow(2**31)
    wants_draft_model = drafting.drafter != "ngram" and not (drafting.k.mode == "fixed" and drafting.k.k == 0)
    verifier, draft = load_models(resolved, load, need_draft=wants_draft_model)
    tokens = prompt_tokens(verifier, prompt, raw=raw, system=system)
    policy, k_source = make_policy(drafting.k, verifier=resolved.verifier, draft=resolved.draft,
                                   drafter=drafting.drafter, temperature=settings.temperature,
                                   recommended_k=resolved.recommended_k, force_spec=drafting.force_spec,
                                   verify_profile=verify_costs.stored(verifier))
    drafter = build_drafter(drafting.drafter, draft, p_min=drafting.p_min, n_min=drafting.n_min)
    if resolved.draft is None and drafting.drafter != "ngram" and not quiet and not json_output:
        err_console.print("no draft model given (-md): decoding with the verifier alone", style="yellow")
    stream = TokenStream(verifier.token_bytes, console=None if json_output else out_console,
                         out=None if json_output else out, show_rejected=show_rejected)
    if show_rejected and out_console is not None and not json_output:
        err_console.print(legend())
    stats = GenerationStats()
    start = time.perf_counter()
    for event in speculate(verifier=verifier, drafter=drafter, prompt_tokens=tokens, k=policy,
                           max_tokens=max_tokens, settings=settings, rng=np.random.default_rng(seed)):
        stats.add(event)
        stream.write(event)
    stats.wall_seconds = time.perf_counter() - start - stats.prefill_seconds
    stream.finish()
    result = {
        "text": stream.text,
        **stats.as_dict(),
        "prompt_tokens": len(tokens),
        "k_source": k_source,
        "settings": {
            "model": str(resolved.verifier), "model_draft": str(resolved.draft) if draft else None,
            "pair": resolved.name, "drafter": drafting.drafter if drafter else None,
            "draft_max": drafting.k.k if drafting.k.mode == "fixed" else drafting.k.mode,
            "draft_p_min": drafting.p_min, "draft_min": drafting.n_min, "max_tokens": max_tokens,
            **asdict(settings), "seed": seed, **asdict(load), "raw": raw,
            "rpc": [str(worker) for worker in load.rpc], "placement": placement(verifier, draft),
        },
    }
    if json_output:
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
    elif not quiet:
        _report(stats, k_source, load, err_console, where=where_line(verifier, draft) if load.rpc else None)
    return result


def placement(verifier, draft) -> dict:
    """Where each model's layers are (for --json): workers, layer counts, and in words."""
    return {role: {**asdict(model.placement), "description": model.placement.describe(role)}
            for role, model in (("verifier", verifier), ("draft", draft)) if hasattr(model, "placement")}


def where_line(verifier, draft) -> str:
    """'verifier on 2 RPC workers · draft local', for the stats line."""
    return " · ".join(entry["description"] for entry in placement(verifier, draft).values())


def _report(stats: GenerationStats, k_source: str, load: LoadOptions, err_console: Console, *,
            where: str | None = None) -> None:
    if stats.stop == "context":
        err_console.print(f"stopped: the context ({load.n_ctx} tokens) is full; raise -c/--ctx-size",
                          style="yellow")
    err_console.print(Text(f"{stats.summary()} · {k_source}" + (f" · {where}" if where else ""), style="dim"))
    if k_source.startswith("K adaptive") and stats.n_steps >= 8 and stats.n_plain_steps > stats.n_steps / 2:
        err_console.print("speculation was losing on this machine: most steps decoded plain"
                          " (see `specgguf bench`; --force-spec keeps drafting)", style="yellow")
