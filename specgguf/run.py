"""`specgguf run`: one prompt in, the verifier's answer out, sooner."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass
from typing import TextIO

import numpy as np
from rich.console import Console
from rich.text import Text

from .engine import speculate
from .errors import PromptError
from .render import TokenStream, legend
from .resolve import ResolvedPair
from .sampling import SamplingSettings
from .stats import GenerationStats

DEFAULT_K = 8


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0


def load_models(resolved: ResolvedPair, options: LoadOptions, *, need_draft: bool):
    """Load the verifier and (if drafting) the draft, refusing pairs llama.cpp would refuse."""
    from .backend import LlamaModel  # llama.cpp loads only when a command needs it
    from .compat import ensure_compatible

    verifier = LlamaModel(resolved.verifier, n_ctx=options.n_ctx, n_threads=options.n_threads,
                          n_gpu_layers=options.n_gpu_layers)
    if not need_draft or resolved.draft is None:
        return verifier, None
    draft = LlamaModel(resolved.draft, n_ctx=options.n_ctx, n_threads=options.n_threads,
                       n_gpu_layers=options.n_gpu_layers_draft)
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


def run_prompt(*, prompt: str, resolved: ResolvedPair, k: int | None, max_tokens: int,
               settings: SamplingSettings, seed: int | None, load: LoadOptions, raw: bool = False,
               system: str | None = None, json_output: bool = False, show_rejected: bool = False,
               quiet: bool = False, out: TextIO, out_console: Console | None, err_console: Console) -> dict:
    """Generate one answer; stream it (or print one JSON object) and report stats on stderr."""
    k = k if k is not None else (resolved.recommended_k if resolved.recommended_k is not None else DEFAULT_K)
    seed = seed if seed is not None else secrets.randbelow(2**31)
    verifier, draft = load_models(resolved, load, need_draft=k > 0)
    tokens = prompt_tokens(verifier, prompt, raw=raw, system=system)
    if resolved.draft is None and k > 0 and not quiet and not json_output:
        err_console.print("no draft model given (-md): decoding with the verifier alone", style="yellow")
    stream = TokenStream(verifier.token_bytes, console=None if json_output else out_console,
                         out=None if json_output else out, show_rejected=show_rejected)
    if show_rejected and out_console is not None and not json_output:
        err_console.print(legend())
    stats = GenerationStats()
    start = time.perf_counter()
    for event in speculate(verifier=verifier, draft=draft, prompt_tokens=tokens, k=k, max_tokens=max_tokens,
                           settings=settings, rng=np.random.default_rng(seed)):
        stats.add(event)
        stream.write(event)
    stats.wall_seconds = time.perf_counter() - start - stats.prefill_seconds
    stream.finish()
    result = {
        "text": stream.text,
        **stats.as_dict(),
        "prompt_tokens": len(tokens),
        "settings": {
            "model": str(resolved.verifier), "model_draft": str(resolved.draft) if draft else None,
            "pair": resolved.name, "draft_max": k if draft else 0, "max_tokens": max_tokens,
            **{name: value for name, value in asdict(settings).items()}, "seed": seed,
            **asdict(load), "raw": raw,
        },
    }
    if json_output:
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
    if stats.stop == "context" and not quiet:
        err_console.print(f"stopped: the context ({load.n_ctx} tokens) is full; raise -c/--ctx-size",
                          style="yellow")
    if not quiet and not json_output:
        err_console.print(Text(stats.summary(), style="dim"))
    return result
