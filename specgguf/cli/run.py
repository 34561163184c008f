"""`specgguf run`: one prompt in, the verifier's answer out, sooner."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..conversation import Prompts
from ..core.drafters import DRAFTER_KINDS
from ..core.sampling import SamplingSettings
from ..core.stats import GenerationStats
from ..files.resolve import ResolvedPair
from ..grammar import GrammarSpec, constraint_for
from ..prepare import MEASURING, DraftOptions, KSource, LoadOptions, Prepared, placement, prepare, where_line
from .render import TokenStream, legend


def run_prompt(
    *,
    prompt: str,
    resolved: ResolvedPair,
    drafting: DraftOptions,
    max_tokens: int,
    settings: SamplingSettings,
    seed: int | None,
    load: LoadOptions,
    raw: bool = False,
    system: str | None = None,
    json_output: bool = False,
    show_rejected: bool = False,
    quiet: bool = False,
    grammar: GrammarSpec | None = None,
    out: TextIO,
    out_console: Console | None,
    err_console: Console,
) -> dict:
    """Generate one answer; stream it (or print one JSON object) and report stats on stderr."""
    seed = seed if seed is not None else secrets.randbelow(2**31)
    prepared = prepare(
        resolved,
        load,
        drafting,
        on_measure=None if quiet or json_output else lambda: err_console.print(MEASURING, style="dim"),
    )
    verifier, draft = prepared.verifier, prepared.draft
    tokens = Prompts(verifier).question(prompt, raw=raw, system=system)
    policy, k_source = prepared.policy(temperature=settings.temperature)
    drafter = prepared.drafter()
    if resolved.draft is None and DRAFTER_KINDS[drafting.drafter].needs_model and not quiet and not json_output:
        err_console.print("no draft model given (-md): decoding with the verifier alone", style="yellow")
    stream = TokenStream(
        verifier.token_bytes,
        console=None if json_output else out_console,
        out=None if json_output else out,
        show_rejected=show_rejected,
    )
    if show_rejected and out_console is not None and not json_output:
        err_console.print(legend())
    constraint = None if grammar is None else constraint_for(verifier, grammar)
    generation = prepared.generate(
        tokens,
        drafter=drafter,
        policy=policy,
        max_tokens=max_tokens,
        settings=settings,
        seed=seed,
        constraint=constraint,
    )
    stats = stream.write_all(generation)
    result = {
        "text": stream.text,
        **stats.as_dict(),
        "prompt_tokens": len(tokens),
        "k_source": str(k_source),
        "settings": _settings(prepared, drafter is not None, settings, max_tokens=max_tokens, seed=seed, raw=raw),
    }
    if json_output:
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
    elif not quiet:
        _report(stats, k_source, load, err_console, where=where_line(verifier, draft) if load.rpc else None)
    prepared.save_ngrams()  # after the answer is out: a failure here loses nothing written
    return result


def _settings(
    prepared: Prepared, drafted: bool, settings: SamplingSettings, *, max_tokens: int, seed: int, raw: bool
) -> dict:
    """What --json reports of the pair, the drafting and the loading."""
    resolved, drafting, load = prepared.resolved, prepared.options, prepared.load
    return {
        "model": str(resolved.verifier),
        "model_draft": str(resolved.draft) if prepared.draft else None,
        "pair": resolved.name,
        "drafter": drafting.drafter if drafted else None,
        "draft_max": drafting.k.k if drafting.k.mode == "fixed" else drafting.k.mode,
        "draft_p_min": drafting.p_min,
        "draft_min": drafting.n_min,
        "max_tokens": max_tokens,
        **asdict(settings),
        "seed": seed,
        **asdict(load),
        "raw": raw,
        "rpc": [str(worker) for worker in load.rpc],
        "placement": placement(prepared.verifier, prepared.draft),
    }


def _report(
    stats: GenerationStats, k_source: KSource, load: LoadOptions, err_console: Console, *, where: str | None = None
) -> None:
    if stats.stop == "context":
        err_console.print(f"stopped: the context ({load.n_ctx} tokens) is full; raise -c/--ctx-size", style="yellow")
    err_console.print(Text(f"{stats.summary()} · {k_source}" + (f" · {where}" if where else ""), style="dim"))
    if k_source.adaptive and not k_source.decided and stats.n_steps >= 8 and stats.n_plain_steps > stats.n_steps / 2:
        err_console.print(
            "speculation was losing on this machine: most steps decoded plain"
            " (see `specgguf bench`; --force-spec keeps drafting)",
            style="yellow",
        )
