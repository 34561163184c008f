"""The default's drafting on the suite's greedy answers, replayed on a clock that reads the verify curve.

`scripts/copy_bound.py --out FILE` stores each suite answer (the verifier's greedy tokens) and the
verify curve it measured. This replays the default through the real engine, drafter and K policy
(`prepare`, as `run` sets them up, a new n-gram cache per answer) against an oracle verifier that
answers each row with the stored answer's next token, and a clock that advances by the curve's cost
for each verify pass (and the draft model's per token, if it drafts). So a policy change is measured
on all prompts without the machine's noise, as modelled seconds:

    default ÷ plain = (n − 1) · verify[1 row] / (the passes' modelled seconds)

(the prompt's pass scores an answer's first token, so plain decoding makes n − 1 passes for n tokens).
With `--context-us β` each pass of n rows after c tokens of context costs n·β·(c − 256) more, on both
sides (llama.cpp's CPU attention reads the cache once per row: docs/adaptive-k.md measures β); the
policy itself still prices passes by the curve and what it learns.

beside copy_bound's ceilings. Python's own time per step is left out on both sides. It runs the
policies as shipped; to try a change, edit the code and run again. Greedy only (the oracle is the
greedy answer). Counts only: it may run on a busy machine.

    .venv/bin/python scripts/policy_replay.py --answers /tmp/bound.json \\
        -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ngram_evidence import greedy_turns  # noqa: E402

from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.bench.traces import CHAT, load_trace  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.acceptance_counts import PolicyConfig  # noqa: E402
from specgguf.core.engine import speculate  # noqa: E402
from specgguf.core.events import GenerationStats  # noqa: E402
from specgguf.core.ngram_cache import SessionNgrams  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.files.resolve import ResolvedPair  # noqa: E402
from specgguf.kchoice import KChoice  # noqa: E402
from specgguf.prepare import DraftOptions, LoadOptions, prepare  # noqa: E402


def policy_config(items: list[str]) -> PolicyConfig | None:
    """PolicyConfig with `field=value` overrides, each read as its field's type; None for none (as `run`
    makes it). Raises ValueError naming a field it has not, or a value its type does not read."""
    if not items:
        return None
    types = {field.name: field.type for field in dataclasses.fields(PolicyConfig)}
    readers: dict[str, Callable[[str], Any]] = {
        "int": int,
        "float": float,
        "bool": lambda text: {"true": True, "false": False}[text.lower()],
    }
    overrides: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in types:
            raise ValueError(f"PolicyConfig has no field {key!r} (it has {', '.join(types)})")
        try:
            overrides[key] = readers[str(types[key])](value)
        except (KeyError, ValueError):
            raise ValueError(f"{item!r}: {key} is a {types[key]}") from None
    return PolicyConfig(**overrides)


def curve(text: str) -> tuple[float, ...]:
    """A verify curve as given on the command line: milliseconds for 1, 2, … rows, comma-separated,
    in seconds."""
    try:
        seconds = tuple(float(ms) / 1e3 for ms in text.split(","))
    except ValueError:
        seconds = ()
    if len(seconds) < 2 or not all(0 < s < float("inf") for s in seconds):
        raise argparse.ArgumentTypeError(f"{text!r}: milliseconds for 1, 2, … rows, comma-separated, e.g. 27,54,72")
    return seconds


class Clock:
    """Modelled seconds: time.perf_counter() reads this while the replay runs. With `noise`, what the
    engine reads of each pass (and so the costs its policy learns) is off by that share (a normal
    draw from `seed`), as a real machine's passes are, while `now`, which the ratios are taken of, is
    not: replays with several seeds show how far a policy's decisions, not the clock, move a ratio."""

    def __init__(self, noise: float = 0.0) -> None:
        self.now = self.seen = 0.0
        self.noise, self.rng = noise, np.random.default_rng(0)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.seen += seconds * max(0.1, 1.0 + self.noise * self.rng.standard_normal()) if self.noise else seconds

    def __call__(self) -> float:
        return self.seen


TABLE_CONTEXT = 256  # the context a verify curve is measured after (costs.measure's default)


def pass_seconds(verify: list[float], n: int, context: int, context_row: float) -> float:
    """What the clock charges a pass of n rows after `context` tokens: the curve (past its end, its last
    size's cost per row), plus each row's attention to the context past the table's."""
    tabled = verify[min(n, len(verify)) - 1] * max(1.0, n / len(verify))
    return tabled + n * context_row * max(0, context - TABLE_CONTEXT)


class OracleVerifier:
    """A Model whose every row scores the stored answer's next token (position p of the context scores
    answer[p + 1 - len(prompt)]; past the answer, end of generation), each pass costing the curve."""

    def __init__(
        self,
        prompt: list[int],
        answer: list[int],
        *,
        n_vocab: int,
        eog: int,
        verify: list[float],
        clock,
        context_row: float = 0.0,
    ):
        self.truth, self.n_prompt = prompt + answer, len(prompt)
        self.n_vocab, self.n_ctx, self.max_leaves = n_vocab, 8192, 1
        self.eog, self.verify, self.clock = eog, verify, clock
        self.context_row = context_row  # seconds a row adds per context token past the table's
        self.cached: list[int] = []
        self.pending: list[int] = []
        self.passes: list[int] = []  # rows of each pass after the prompt's

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def _rows(self, positions: Sequence[int]) -> np.ndarray:
        rows = np.zeros((len(positions), self.n_vocab), dtype=np.float32)
        for i, position in enumerate(positions):
            nxt = position + 1
            rows[i, self.truth[nxt] if nxt < len(self.truth) else self.eog] = 20.0
        return rows

    def _pay(self, n: int) -> None:
        if self.cached:  # the prompt's pass is not modelled (the engine leaves it out of the answer's time)
            self.passes.append(n)
            self.clock.advance(pass_seconds(self.verify, n, len(self.cached), self.context_row))

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        self._pay(len(tokens))
        start = len(self.cached)
        self.cached += list(tokens)
        return self._rows(range(start + len(tokens) - n_logits, start + len(tokens)))

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        if any(parent != i - 1 for i, parent in enumerate(parents)):
            raise ValueError("the replay checks chains only (trees are off by default)")
        self._pay(len(tokens))
        self.pending = list(tokens)
        start = len(self.cached)
        return self._rows(range(start + len(tokens) - n_logits, start + len(tokens)))

    def keep_path(self, path: Sequence[int]) -> None:
        self.cached += [self.pending[i] for i in path]
        self.pending = []

    def rewind(self, n_past: int) -> None:
        del self.cached[n_past:]

    def is_eog(self, token: int) -> bool:
        return token == self.eog


def replay_one(
    prepared,
    prompt: list[int],
    answer: list[int],
    *,
    verify: list[float],
    clock: Clock,
    eog: int,
    policy,
    drafter,
    context_row: float = 0.0,
) -> dict:
    """One answer's steps under `policy` and `drafter` against the oracle: its modelled ratio to plain and counts."""
    oracle = OracleVerifier(
        prompt, answer, n_vocab=prepared.verifier.n_vocab, eog=eog, verify=verify, clock=clock, context_row=context_row
    )
    written: list[int] = []
    stats = GenerationStats()
    steps: list[str] = []
    positions: list[int] = []  # the answer position each step's first token fills
    start = clock.now
    for event in speculate(
        verifier=oracle,
        drafter=drafter,
        prompt_tokens=prompt,
        k=policy,
        max_tokens=len(answer),
        settings=SamplingSettings(temperature=0.0),
        rng=np.random.default_rng(0),
    ):
        written += event.tokens
        stats.add(event)
        prior = f"@{event.draft_confidence[0]:.2f}" if event.n_drafted and event.draft_confidence else ""
        steps.append(f"{event.n_accepted}/{event.n_drafted}{prior}" if event.n_drafted else ".")
        positions.append(len(written) - len(event.tokens))
    if written != answer[: len(written)]:
        raise SystemExit("the replay wrote another answer: the oracle is not followed")
    seconds = clock.now - start
    # plain decoding's passes: the prompt's pass scores the first token; the pass for token i reads the rest
    plain = sum(pass_seconds(verify, 1, len(prompt) + i, context_row) for i in range(len(written) - 1))
    return {
        "tokens": len(written),
        "plain": plain,
        "seconds": seconds,
        "ratio": plain / seconds,
        "drafted": stats.n_drafted,
        "kept": stats.n_accepted,
        "passes": oracle.passes,
        "steps": steps,
        "positions": positions,
    }


def report(name: str, row: dict, *, ceilings: str = "", lookup: list[int] | None = None, steps: bool) -> None:
    """One answer's line; with `steps`, its steps (with `lookup`, its plain steps where lookup had a right draft)."""
    sizes = {n: row["passes"].count(n) for n in sorted(set(row["passes"]))}
    print(
        f"{name:20} default ÷ plain {row['ratio']:.3f}×  {ceilings}drafted {row['drafted']}, kept {row['kept']};"
        f" passes by rows {sizes}",
        file=sys.__stdout__,
        flush=True,
    )
    if not steps:
        return
    print("  " + " ".join(row["steps"]), file=sys.__stdout__, flush=True)
    missed = ""
    if lookup is not None:
        n = sum(1 for t, step in zip(row["positions"], row["steps"]) if step == "." and lookup[t] > 0)
        missed = f"plain steps where lookup had a right draft: {n}; "
    print(f"  {missed}drafts rejected: {row['drafted'] - row['kept']}", file=sys.__stdout__, flush=True)


def read_json(path: Path) -> dict:
    """A JSON object from `path`; one line (SystemExit) where it cannot be read or is not one."""
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"specgguf: error: {path}: {error}") from None
    if not isinstance(found, dict):
        raise SystemExit(f"specgguf: error: {path}: not a JSON object")
    return found


def trace_answers(path: Path, trace: str, prepared, history: Path | None = None) -> dict:
    """A trace's chat turns with the verifier's greedy answers (ngram_evidence.greedy_turns), or with the
    answers in `history` (ab_traces.py --save: a server's), and this machine's verify table: read from
    `path`, or made and written there when it does not exist or `history` is given."""
    if path.exists() and history is None:
        stored = read_json(path)
        if stored.get("trace") != trace:
            raise SystemExit(
                f"specgguf: error: {path} holds the {stored.get('trace')!r} trace's answers, not {trace!r}'s"
            )
        return stored
    requests = load_trace(trace).requests
    answers = None
    if history is not None:
        saved = read_json(history)
        if saved.get("trace") != trace:
            raise SystemExit(
                f"specgguf: error: {history} holds a server's answers to {saved.get('trace')!r}, not {trace!r}"
            )
        answers = [
            message.get("content") or "" for message in saved.get("messages", []) if message.get("role") == "assistant"
        ]
        wanted = sum(request.path == CHAT for request in requests)
        if len(answers) != wanted:
            raise SystemExit(
                f"specgguf: error: {history} holds {len(answers)} answers; the trace has {wanted} chat turns"
            )
    turns = [
        {"prompt": index, "tokens": tokens, "reply": reply}
        for index, tokens, _, reply in greedy_turns(prepared.verifier, requests, answers)
    ]
    stored = {"trace": trace, "verify": list(prepared.costs.verify), "turns": turns}
    path.write_text(json.dumps(stored))
    return stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--answers", required=True, type=Path, help="copy_bound.py --out FILE (with --trace: read or written)"
    )
    parser.add_argument("-m", required=True, type=Path)
    parser.add_argument("-md", type=Path)
    parser.add_argument("--prompts", help="comma-separated suite names (default: all stored)")
    parser.add_argument("--trace", help="a shipped trace's chat turns (chat, agent) with one policy and n-gram session")
    parser.add_argument("--history", type=Path, help="with --trace: a server's answers (ab_traces.py --save FILE)")
    parser.add_argument("--config", action="append", default=[], help="a PolicyConfig field=value to try (repeatable)")
    parser.add_argument(
        "--steps",
        action="store_true",
        help="print each step: kept/drafted@the first draft's prior chance, or . for a plain one",
    )
    parser.add_argument(
        "--verify-ms",
        type=curve,
        help="the verify curve to price passes with, ms for 1, 2, … rows (default: the stored one)",
    )
    parser.add_argument(
        "--stored-ms",
        type=curve,
        help="the verify curve the policy starts from, as tuning.json would hold it (default: the stored one)",
    )
    parser.add_argument(
        "--context-us",
        type=float,
        default=0.0,
        help="microseconds each verify row adds per context token past the curve's (256), on the clock",
    )
    parser.add_argument(
        "--noise", type=float, default=0.0, help="the share by which each pass's time as the engine reads it is off"
    )
    parser.add_argument("--seed", type=int, default=0, help="with --noise: the draws' seed (the first, with --seeds)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="with --noise: replay this many times, each seed after the last, and sum up",
    )
    args = parser.parse_args()
    if args.noise < 0:
        parser.error("--noise takes a share of 0 or more")
    if args.context_us < 0:
        parser.error("--context-us takes microseconds of 0 or more")
    if args.seeds < 1 or (args.seeds > 1 and not args.noise):
        parser.error("--seeds takes a count of 1 or more, and more than 1 only with --noise above 0")
    try:
        config = policy_config(args.config)
    except ValueError as error:
        parser.error(str(error))
    pair = ResolvedPair(verifier=args.m, draft=args.md, name=None, recommended_k=None)
    prepared = prepare(pair, LoadOptions(n_ctx=8192 if args.trace else 4096, n_threads=2), DraftOptions())
    stored = trace_answers(args.answers, args.trace, prepared, args.history) if args.trace else read_json(args.answers)
    if args.verify_ms:  # e.g. trace_ab.py's verify seconds by rows, where the context is long
        stored["verify"] = list(args.verify_ms)
    if args.stored_ms:  # a machine whose own probe measured this curve (e.g. a memory-bound one)
        prepared._costs = dataclasses.replace(prepared.costs, verify=args.stored_ms)
    context_row = args.context_us / 1e6
    clock = Clock(args.noise)
    eog = next(t for t in range(prepared.verifier.n_vocab) if prepared.verifier.is_eog(t))  # past the answer
    if prepared.draft is not None:  # the draft model's passes cost its measured time a token on the clock
        eval_draft, per_token = prepared.draft.eval, prepared.costs.draft

        def timed_draft(tokens, *, n_logits):
            clock.advance(per_token * len(tokens))
            return eval_draft(tokens, n_logits=n_logits)

        prepared.draft.eval = timed_draft  # type: ignore[method-assign]
    # One answer's replay against the oracle, on this clock: (prompt, answer, *, policy, drafter) -> its row.
    replay = partial(replay_one, prepared, verify=stored["verify"], clock=clock, eog=eog, context_row=context_row)
    real_clock, time.perf_counter = time.perf_counter, clock
    summaries = []
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            clock.reseed(seed)
            if args.seeds > 1:
                print(f"seed {seed}:")
            rows = (
                replay_trace(prepared, stored, replay, config=config, steps=args.steps)
                if args.trace
                else replay_suite(prepared, stored, replay, config=config, chosen=args.prompts, steps=args.steps)
            )
            summaries.append(summarize(rows))
    finally:
        time.perf_counter = real_clock
    if len(summaries) > 1:
        totals, lowest = [total for total, _ in summaries], [min(ratios) for _, ratios in summaries]
        ratios = [ratio for _, mine in summaries for ratio in mine]
        print(
            f"over {len(summaries)} seeds: in total {statistics.mean(totals):.3f}×"
            f" ({min(totals):.3f}–{max(totals):.3f}×),"
            f" lowest {statistics.mean(lowest):.3f}× on average (worst {min(lowest):.3f}×),"
            f" below 0.98×: {sum(ratio < 0.98 for ratio in ratios)} of {len(ratios)}"
        )


def summarize(rows: list) -> tuple[float, list[float]]:
    """Print a replay's ratios by kind and over all; return its ratio in total and each answer's."""
    for kind in sorted({entry["kind"] for entry, _ in rows}):
        mine = [row["ratio"] for entry, row in rows if entry["kind"] == kind]
        print(f"{kind:12} median {statistics.median(mine):.3f}× ({min(mine):.3f}–{max(mine):.3f}×)")
    ratios = [row["ratio"] for _, row in rows]
    plain = sum(row["plain"] for _, row in rows)
    total = plain / sum(row["seconds"] for _, row in rows)
    print(
        f"all: median {statistics.median(ratios):.3f}×, lowest {min(ratios):.3f}×, geometric mean"
        f" {float(np.exp(np.mean(np.log(ratios)))):.4f}×, in total {total:.3f}×"
    )
    return total, ratios


def replay_suite(
    prepared, stored: dict, replay: Callable[..., dict], *, config, chosen: str | None, steps: bool
) -> list:
    """Each stored suite answer under a new policy and n-gram session, as `run` answers one prompt."""
    texts = {item.name: item.text for item in load_suite()}
    names = set(chosen.split(",")) if chosen else None
    prompts, rows = Prompts(prepared.verifier), []
    for entry in stored["prompts"]:
        if names is not None and entry["prompt"] not in names:
            continue
        tokens = prompts.question(texts[entry["prompt"]], raw=False, system=None)
        policy, _ = prepared.policy(
            KChoice("adaptive"), temperature=0.0, drafter=prepared.options.drafter, config=config
        )
        drafter = prepared.drafter(prepared.options.drafter, session=SessionNgrams())
        row = replay(tokens, entry["reply"], policy=policy, drafter=drafter)
        rows.append((entry, row))
        ceilings = f"(ceilings: lookup {entry['lookup_bound']:.2f}×, copy {entry['copy_bound']:.2f}×)  "
        report(entry["prompt"], row, ceilings=ceilings, lookup=entry["lookup"], steps=steps)
    return rows


def replay_trace(prepared, stored: dict, replay: Callable[..., dict], *, config, steps: bool) -> list:
    """A trace's turns in order under one policy and one n-gram session, as `serve` answers a client's
    requests (serve/plan.py keeps a policy per setting and the session's n-grams across requests)."""
    policy, _ = prepared.policy(KChoice("adaptive"), temperature=0.0, drafter=prepared.options.drafter, config=config)
    session, rows = SessionNgrams(), []
    for turn in stored["turns"]:
        if not turn["reply"]:  # the answer ends at once (an agent's turn after its last tool call): no step
            print(f"turn {turn['prompt']}: an empty answer, nothing to replay", file=sys.stderr)
            continue
        drafter = prepared.drafter(prepared.options.drafter, session=session)
        row = replay(turn["tokens"], turn["reply"], policy=policy, drafter=drafter)
        rows.append(({"kind": stored["trace"]}, row))
        report(f"turn {turn['prompt']}", row, steps=steps)
    return rows


if __name__ == "__main__":
    run_script(main)
