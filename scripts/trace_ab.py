"""The default against `-k 0` on each of a trace's chat turns, in one process, with every step's figures.

What `ab_traces.py --b "-k 0" --same-history` measures through two servers, without HTTP and the
servers' drift apart: the turns of `policy_replay.py --trace`'s answers file (each turn's prompt after
the verifier's own greedy answers to the ones before), each answered `--repeats` times by the default
(one policy and one n-gram session across the turns, as `serve` keeps them; each repeat starts from
their state before the turn, so a repeat does not draft from its own earlier answer) and as often by
plain decoding (the same drafter kind with K 0, as `serve -k 0` runs), interleaved ABBA; the prompt is
read once a turn. Per turn the median generation rate of each (the first token, scored by the prompt's
pass, left out) and their ratio, and with `--steps` the default's steps (kept/drafted, m where the draft
model drafted, or . for a plain one) and its verify seconds by rows. Quiet machine only, one benchmark at a time:

    .venv/bin/python scripts/trace_ab.py --answers /tmp/chat_answers.json \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --steps
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgguf.bench.machine import cpu  # noqa: E402
from specgguf.core.engine import FixedK, speculate  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.kchoice import KChoice  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402

KEY = "trace_ab"  # the snapshots' key (SessionNgrams.save/load)


def snapshot(session: SessionNgrams, folder: Path) -> Path:
    path = folder / "session.npz"
    session.save(path, key=KEY)
    return path


def answer(prepared, prompt: list[int], *, policy, session: SessionNgrams, max_tokens: int) -> dict:
    """One answer: its generation rate (the first token, from the prompt's pass, left out) and its steps."""
    drafter = prepared.drafter(prepared.options.drafter, session=session)
    steps: list[str] = []
    verify: dict[int, list[float]] = defaultdict(list)
    tokens, first, last = 0, None, None
    for event in speculate(
        verifier=prepared.verifier,
        drafter=drafter,
        prompt_tokens=prompt,
        k=policy,
        max_tokens=max_tokens,
        settings=SamplingSettings(temperature=0.0),
        rng=np.random.default_rng(0),
    ):
        now = time.perf_counter()
        if first is None:
            first = now  # the prompt's pass scored the first token
        else:
            tokens += len(event.tokens)
            last = now
            mark = "m" if event.draft_source == "model" else ""  # the draft model's (else n-gram lookup's)
            steps.append(f"{event.n_accepted}/{event.n_drafted}{mark}" if event.n_drafted else ".")
            verify[event.n_drafted + 1].append(event.verify_seconds)
    seconds = (last - first) if last is not None and first is not None else 0.0
    return {"rate": tokens / seconds if seconds else 0.0, "steps": steps, "verify": verify}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", required=True, type=Path, help="policy_replay.py --trace NAME --answers FILE")
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", type=Path)
    parser.add_argument("--repeats", type=int, default=2, help="answers of each per turn (default 2: ABBA)")
    parser.add_argument(
        "--turns", help="comma-separated turn indexes to measure (default: all; the others still teach)"
    )
    parser.add_argument("--steps", action="store_true", help="print the default's steps and verify seconds by rows")
    args = parser.parse_args()
    stored = json.loads(args.answers.read_text())
    pair = ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None)
    prepared = prepare(pair, LoadOptions(n_ctx=8192, n_threads=2), DraftOptions())
    print(f"CPU: {cpu()}; verify table (ms): {[round(x * 1e3, 1) for x in prepared.costs.verify]}", flush=True)
    policy, _ = prepared.policy(KChoice("adaptive"), temperature=0.0, drafter=prepared.options.drafter)
    session = SessionNgrams()
    chosen = None if args.turns is None else {int(turn) for turn in args.turns.split(",")}
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for number, turn in enumerate(stored["turns"]):
            prompt, n = turn["tokens"], len(turn["reply"])
            if chosen is not None and turn["prompt"] not in chosen:
                answer(prepared, prompt, policy=policy, session=session, max_tokens=n)  # it teaches as served
                continue
            saved, before = snapshot(session, Path(folder)), copy.deepcopy(policy)
            rates: dict[str, list[float]] = {"default": [], "plain": []}
            kept = None
            for repeat in range(args.repeats):
                order = ["default", "plain"] if (number + repeat) % 2 == 0 else ["plain", "default"]
                for side in order:
                    mine = SessionNgrams.load(saved, key=KEY)
                    if side == "plain":
                        result = answer(prepared, prompt, policy=FixedK(0), session=mine, max_tokens=n)
                    else:
                        trial = copy.deepcopy(before)
                        result = answer(prepared, prompt, policy=trial, session=mine, max_tokens=n)
                        kept = kept or (trial, mine, result)
                    rates[side].append(result["rate"])
            assert kept is not None
            policy, session, result = kept  # the turn's first default answer goes on, as a server's would
            ratio = statistics.median(rates["default"]) / statistics.median(rates["plain"])
            ratios.append(ratio)
            steps = result["steps"]
            drafted = sum(int(step.partition("/")[2].rstrip("m")) for step in steps if step != ".")
            accepted = sum(int(step.partition("/")[0]) for step in steps if step != ".")
            print(
                f"turn {turn['prompt']:2}: default {statistics.median(rates['default']):.1f} tok/s, plain"
                f" {statistics.median(rates['plain']):.1f} tok/s: {ratio:.3f}×  (each: "
                f"{', '.join(f'{x:.1f}' for x in rates['default'])} / {', '.join(f'{x:.1f}' for x in rates['plain'])});"
                f" kept {accepted}/{drafted}",
                flush=True,
            )
            if args.steps:
                print("  " + " ".join(steps))
                by_rows = {
                    rows: f"{statistics.median(s) * 1e3:.1f} ms ×{len(s)}"
                    for rows, s in sorted(result["verify"].items())
                }
                print(f"  verify by rows: {by_rows}", flush=True)
    print(f"turns: lowest {min(ratios):.3f}×, median {statistics.median(ratios):.3f}×")


if __name__ == "__main__":
    main()
