"""The default against `-k 0` on each of a trace's chat turns, in one process, with every step's figures.

What `ab_traces.py --b "-k 0" --same-history` measures through two servers, without HTTP and the
servers' drift apart: the turns of `policy_replay.py --trace`'s answers file (each turn's prompt after
the verifier's own greedy answers to the ones before), each answered `--repeats` times by the default
(one policy and one n-gram session across the turns, as `serve` keeps them; each repeat starts from
their state before the turn, so a repeat does not draft from its own earlier answer) and as often by
plain decoding (K 0, as `serve -k 0` runs), interleaved ABBA; the prompt is read once a turn. Per turn
the median generation rate of each (the first token, scored by the prompt's pass, left out) and their
ratio, and with `--steps` the default's steps (kept/drafted, m where the draft model drafted, or . for
a plain one) and its verify seconds by rows. `--b-config field=value` makes B the default with that
PolicyConfig change instead of `-k 0` (its own policy going on across the turns too); with
copy_bound.py's answers file, the suite's prompts, each answered as `run` does (a new policy and
session). Quiet machine only, one benchmark at a time:

    .venv/bin/python scripts/trace_ab.py --answers /tmp/chat_answers.json \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --steps
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_replay import policy_config, read_json  # noqa: E402

from specgguf.bench.machine import cpu  # noqa: E402
from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.engine import FixedK, speculate  # noqa: E402
from specgguf.core.events import GenerationStats  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
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
    stats = GenerationStats()  # of the steps after the first (the prompt's pass scored its token)
    first: float | None = None
    last: float | None = None
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
            first = now
            continue
        stats.add(event)
        last = now
        mark = "m" if event.draft_source == "model" else ""  # the draft model's (else n-gram lookup's)
        steps.append(f"{event.n_accepted}/{event.n_drafted}{mark}" if event.n_drafted else ".")
        verify[event.n_drafted + 1].append(event.verify_seconds)
    seconds = (last - first) if last is not None and first is not None else 0.0
    rate = stats.n_tokens / seconds if seconds else 0.0
    return {"rate": rate, "steps": steps, "verify": verify, "drafted": stats.n_drafted, "accepted": stats.n_accepted}


def duel(prepared, prompt: list[int], n: int, sides: dict, *, repeats: int, number: int, saved: Path | None):
    """Each side's answers to one prompt, interleaved ABBA (`number` turns the order): its rates and its
    first answer (with the policy and session that made it). `sides`: name -> a new policy for an answer;
    each answer's n-gram session is `saved`'s state (a new one where None)."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    first: dict[str, tuple] = {}
    for repeat in range(repeats):
        order = list(sides) if (number + repeat) % 2 == 0 else list(sides)[::-1]
        for name in order:
            session = SessionNgrams.load(saved, key=KEY) if saved is not None else SessionNgrams()
            policy = sides[name]()
            result = answer(prepared, prompt, policy=policy, session=session, max_tokens=n)
            rates[name].append(result["rate"])
            first.setdefault(name, (policy, session, result))
    return rates, first


def report(label: str, rates: dict[str, list[float]], result: dict, *, steps: bool) -> float:
    """One prompt's line (A's median rate ÷ B's), and with `steps` A's steps; returns the ratio."""
    (a, mine), (b, theirs) = rates.items()
    ratio = statistics.median(mine) / statistics.median(theirs)
    print(
        f"{label}: {a} {statistics.median(mine):.1f} tok/s, {b} {statistics.median(theirs):.1f} tok/s: {ratio:.3f}×"
        f"  (each: {', '.join(f'{x:.1f}' for x in mine)} / {', '.join(f'{x:.1f}' for x in theirs)}); {a} kept"
        f" {result['accepted']}/{result['drafted']}",
        flush=True,
    )
    if steps:
        print("  " + " ".join(result["steps"]))
        by_rows = {
            rows: f"{statistics.median(s) * 1e3:.1f} ms ×{len(s)}" for rows, s in sorted(result["verify"].items())
        }
        print(f"  verify by rows: {by_rows}", flush=True)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--answers", required=True, type=Path, help="policy_replay.py --trace NAME --answers FILE, or copy_bound.py's"
    )
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", type=Path)
    parser.add_argument("--repeats", type=int, default=2, help="answers of each per turn (default 2: ABBA)")
    parser.add_argument(
        "--turns", help="comma-separated turn indexes to measure (default: all; the others still teach)"
    )
    parser.add_argument(
        "--b-config",
        action="append",
        default=[],
        help="B is the default with this PolicyConfig field=value (repeatable) instead of -k 0",
    )
    parser.add_argument("--steps", action="store_true", help="print the default's steps and verify seconds by rows")
    args = parser.parse_args()
    stored = read_json(args.answers)
    try:
        b_config = policy_config(args.b_config)
    except ValueError as error:
        parser.error(str(error))
    pair = ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None)
    prepared = prepare(pair, LoadOptions(n_ctx=8192, n_threads=2), DraftOptions())
    print(f"CPU: {cpu()}; verify table (ms): {[round(x * 1e3, 1) for x in prepared.costs.verify]}", flush=True)

    def fresh(config=None):
        return prepared.policy(temperature=0.0, config=config)[0]

    b_name = "B" if b_config is not None else "plain"
    ratios = []
    if "turns" not in stored:  # copy_bound.py's suite answers: each prompt as `run` answers it, all new
        texts = {item.name: item.text for item in load_suite()}
        prompts = Prompts(prepared.verifier)
        for number, entry in enumerate(stored["prompts"]):
            prompt = prompts.question(texts[entry["prompt"]], raw=False, system=None)
            sides = {"default": fresh, b_name: partial(fresh, b_config) if b_config else partial(FixedK, 0)}
            rates, first = duel(
                prepared, prompt, len(entry["reply"]), sides, repeats=args.repeats, number=number, saved=None
            )
            ratios.append(report(f"{entry['prompt']:20}", rates, first["default"][2], steps=args.steps))
        print(
            f"prompts: lowest {min(ratios):.3f}×, median {statistics.median(ratios):.3f}×, geometric mean"
            f" {float(np.exp(np.mean(np.log(ratios)))):.4f}×"
        )
        return
    # The default's policy and session go on from turn to turn, as a server's; so does B's policy.
    policy, other, session = fresh(), fresh(b_config) if b_config else None, SessionNgrams()
    chosen = None if args.turns is None else {int(turn) for turn in args.turns.split(",")}
    with tempfile.TemporaryDirectory() as folder:
        for number, turn in enumerate(stored["turns"]):
            prompt, n = turn["tokens"], len(turn["reply"])
            if chosen is not None and turn["prompt"] not in chosen:
                answer(prepared, prompt, policy=policy, session=session, max_tokens=n)  # it teaches as served
                continue
            saved = snapshot(session, Path(folder))
            sides = {
                "default": partial(copy.deepcopy, policy),
                b_name: partial(copy.deepcopy, other) if other is not None else partial(FixedK, 0),
            }
            rates, first = duel(prepared, prompt, n, sides, repeats=args.repeats, number=number, saved=saved)
            policy, session, result = first["default"]  # the turn's first default answer goes on, as a server's would
            other = first[b_name][0] if other is not None else None
            ratios.append(report(f"turn {turn['prompt']:2}", rates, result, steps=args.steps))
    print(f"turns: lowest {min(ratios):.3f}×, median {statistics.median(ratios):.3f}×")


if __name__ == "__main__":
    run_script(main)
