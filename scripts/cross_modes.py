"""A draft of another vocabulary, its two modes side by side (issue 47): plain decoding, n-gram drafts
alone, intersection drafting (`--cross-mode tokens`) and string-level drafting (`--cross-mode string`),
and with `--same DRAFT` a draft that shares the verifier's vocabulary, interleaved per prompt and repeat,
in one process. Prints, per prompt and mode: tokens/s, the ratio to plain decoding of the same prompt and
repeat (median over repeats), acceptance, and the string-level mode's text round trip (decode, re-encode)
in ms per step; the CPU and its avx512_vnni flag first (and the verifier's llama-bench figures with
--llama-bench). Then what `--cross-mode auto` measures for the pair (cross_search.choose_mode, kept in
tuning.json as `run` keeps it) and the mode it picks. Quiet machine only:

    .venv/bin/python scripts/cross_modes.py -m VERIFIER.gguf -md DRAFT.gguf --repeats 3 -n 128 [--temp 0.8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.llama_tools import COMPLETION, SPECULATIVE, LlamaTools  # noqa: E402  (after the path)
from specgguf.bench.machine import cpu, machine_lines, machine_report  # noqa: E402
from specgguf.bench.measure import PROMPTS, generate  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.drafters import DraftSettings, build_drafter  # noqa: E402
from specgguf.core.engine import FixedK  # noqa: E402
from specgguf.core.events import GenerationStats  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.drafts.cross_search import choose_mode  # noqa: E402
from specgguf.drafts.cross_vocab import cross_vocab  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402
from specgguf.tuning import read_cost  # noqa: E402

MODES = ("plain", "ngram", "tokens", "string")


def one_run(verifier, draft, cross, mode: str, tokens: list[int], args, seed: int, same=None) -> GenerationStats:
    if mode == "plain":
        drafter, k = None, 0
    elif mode == "ngram":
        drafter, k = build_drafter("ngram", None, DraftSettings(session=SessionNgrams())), args.k
    elif mode == "same":  # a draft that shares the verifier's vocabulary
        drafter, k = build_drafter("model", same, DraftSettings()), args.k
    else:
        drafter, k = build_drafter("model", draft, DraftSettings(cross=replace(cross, mode=mode))), args.k
    reader = same if mode == "same" else draft if mode in ("tokens", "string") else None
    read = read_cost(reader) if reader is not None and k else None  # a long prompt's reading as measured here
    policy = FixedK(k, read_seconds=read)
    return generate(verifier, drafter, tokens, policy=policy, max_tokens=args.n, temperature=args.temp, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", required=True, type=Path, help="the verifier GGUF")
    parser.add_argument("-md", required=True, type=Path, help="a draft GGUF of another vocabulary")
    parser.add_argument("--prompts", default="code,prose,edit", help=f"from {', '.join(PROMPTS)}")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("-n", type=int, default=128, help="tokens per run")
    parser.add_argument("-k", type=int, default=4, help="drafts per step (a fixed K for every mode)")
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--same", type=Path, default=None, help="also a draft GGUF of the verifier's vocabulary")
    parser.add_argument("--llama-bench", type=Path, default=None, help="llama.cpp's llama-bench: print its figures")
    args = parser.parse_args()
    machine = cpu()
    vnni = "yes" if machine["avx512_vnni"] else "no"
    print(
        f"CPU: {machine['cpu']} ({machine['cores']} cores), avx512_vnni: {vnni}; -n {args.n}, K {args.k}, T {args.temp}"
    )
    if args.llama_bench is not None:
        directory = args.llama_bench.parent
        tools = LlamaTools(directory, directory / COMPLETION, directory / SPECULATIVE)
        report = machine_report(tools, [(args.m.name, args.m)], args.threads or os.cpu_count() or 1)
        print(machine_lines(report).split("\n", 1)[1])
    verifier = LlamaModel(args.m, n_ctx=2048, n_threads=args.threads)
    draft = LlamaModel(args.md, n_ctx=2048, n_threads=args.threads)
    same = None if args.same is None else LlamaModel(args.same, n_ctx=2048, n_threads=args.threads)
    modes = MODES + (("same",) if same is not None else ())
    cross = cross_vocab(draft, verifier)
    prompts = Prompts(verifier)
    kinds = [kind.strip() for kind in args.prompts.split(",")]
    tokens = {kind: prompts.question(PROMPTS[kind], raw=False, system=None) for kind in kinds}
    ratios: dict[tuple[str, str], list[float]] = {}
    totals = {(kind, mode): GenerationStats() for kind in kinds for mode in modes}
    for repeat in range(args.repeats):
        for kind in kinds:
            plain = 0.0
            for mode in modes:  # interleaved: each mode once per prompt and repeat
                stats = one_run(verifier, draft, cross, mode, tokens[kind], args, seed=1000 * repeat + 7, same=same)
                plain = stats.tokens_per_second if mode == "plain" else plain
                ratios.setdefault((kind, mode), []).append(stats.tokens_per_second / plain if plain else 0.0)
                totals[kind, mode].merge(stats)
    print(f"{'prompt':8} {'mode':7} {'tok/s':>7} {'× plain':>8} {'accepted':>9} {'text ms/step':>13}")
    for (kind, mode), total in totals.items():
        acceptance = total.n_accepted / total.n_drafted if total.n_drafted else 0.0
        text_ms = 1000 * total.draft_text_seconds / total.n_steps if total.n_steps else 0.0
        print(
            f"{kind:8} {mode:7} {total.tokens_per_second:7.2f} {statistics.median(ratios[kind, mode]):8.2f}"
            f" {acceptance:9.2f} {text_ms:13.3f}"
        )
    chosen = choose_mode(verifier, draft, cross, announce=lambda text: print(text, flush=True))
    print(f"--cross-mode auto: {chosen.mode} ({chosen.describe()}); adopted by -m alone: {chosen.trial.adopted}")
    verifier.close()
    draft.close()
    if same is not None:
        same.close()


if __name__ == "__main__":
    main()
