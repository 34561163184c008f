"""`specgguf run`: one prompt in, the verifier's answer out, sooner."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..conversation import Prompts
from ..core.engine import check_prompt
from ..core.events import GenerationStats
from ..core.sampling import SamplingSettings
from ..errors import PromptError
from ..files.resolve import ResolvedPair
from ..grammar import GrammarSpec, constraint_for
from ..kchoice import KSource
from ..llama.loaded import LoadedModel
from ..prepare import MEASURING, DraftOptions, LoadOptions, Prepared, placement, prepare, where_line
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
    special: bool = True,
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
    if not prompt.strip():
        raise PromptError("the prompt is empty")  # before minutes of loading and measuring, not after
    prepared = prepare(
        resolved,
        load,
        drafting,
        on_measure=None if quiet or json_output else lambda: err_console.print(MEASURING, style="dim"),
        on_announce=None if quiet or json_output else lambda text: err_console.print(text, style="dim"),
        measure_now=False,  # a prompt that cannot be answered is refused first
    )
    verifier = prepared.verifier
    tokens = Prompts(verifier).question(prompt, raw=raw, system=system, special=special)
    check_prompt(verifier, tokens, max_tokens)
    policy, k_source = prepared.policy(temperature=settings.temperature)
    drafter = prepared.drafter()
    stream = _stream(verifier, json_output, show_rejected, out, out_console, err_console)
    constraint = None if grammar is None else constraint_for(verifier, grammar)
    answer = prepared.generate(
        tokens,
        drafter=drafter,
        policy=policy,
        max_tokens=max_tokens,
        settings=settings,
        seed=seed,
        constraint=constraint,
    )
    stats = stream.write_all(answer)
    json_settings = _settings(prepared, drafter is not None, settings, max_tokens=max_tokens, seed=seed, raw=raw)
    result = {
        "text": stream.text,
        **stats.as_dict(),
        "prompt_tokens": len(tokens),
        "k_source": str(k_source),
        "settings": json_settings | {"special": special},
    }
    if json_output:
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
    elif not quiet:
        _report(stats, k_source, prepared, err_console)
    prepared.save_ngrams()  # after the answer is out: a failure here loses nothing written
    prepared.keep_learned_costs(policy)
    return result


def _stream(
    verifier: LoadedModel,
    json_output: bool,
    show_rejected: bool,
    out: TextIO,
    out_console: Console | None,
    err_console: Console,
) -> TokenStream:
    """Where the answer goes: streamed to the terminal or the pipe, or only kept (--json)."""
    if show_rejected and out_console is not None and not json_output:
        err_console.print(legend())
    return TokenStream(
        verifier.token_bytes,
        console=None if json_output else out_console,
        out=None if json_output else out,
        show_rejected=show_rejected,
    )


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
        "draft_variant": _variant(prepared),  # asked and chosen
        "raw": raw,
        "rpc": [str(worker) for worker in load.rpc],
        "placement": placement(prepared.verifier, prepared.draft),
    }


def _made_here(prepared: Prepared) -> str | None:
    """'draft q4_0' on the stats line when a draft made for this machine ran."""
    choice = prepared.draft_choice
    return f"draft {choice.name}" if choice is not None and not choice.variant.is_original else None


def _variant(prepared: Prepared) -> dict | None:
    """Which draft file ran and why (--draft-variant), for --json."""
    choice = prepared.draft_choice
    if choice is None:
        return None
    return {"asked": str(prepared.load.draft_variant), "name": choice.name, "file": str(choice.path), "why": choice.why}


def _report(stats: GenerationStats, k_source: KSource, prepared: Prepared, err_console: Console) -> None:
    load = prepared.load
    where = where_line(prepared.verifier, prepared.draft) if load.rpc else None
    draft = _made_here(prepared)
    if stats.stop == "context":
        err_console.print(f"stopped: the context ({load.n_ctx} tokens) is full; raise -c/--ctx-size", style="yellow")
    extras = "".join(f" · {part}" for part in (draft, where) if part)
    err_console.print(Text(f"{stats.summary()} · {k_source}{extras}", style="dim"))
    if k_source.adaptive and not k_source.decided and stats.n_steps >= 8 and stats.n_plain_steps > stats.n_steps / 2:
        err_console.print(
            "speculation was losing on this machine: most steps decoded plain"
            " (see `specgguf bench`; --force-spec keeps drafting)",
            style="yellow",
        )
