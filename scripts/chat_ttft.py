"""Time to first token across chat turns, with and without KV reuse: `python scripts/chat_ttft.py`.

Plays a five-turn conversation with the pair (greedy), timing from each question
to its first answer token. Then replays the same conversation with both models'
caches emptied before each turn, which is what a chat that re-sends the whole
history costs. With reuse, turn 5 should start about as fast as turn 1; without
it, the time grows with the history.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specgguf.cli.chat_session import ChatSession, Turn
from specgguf.core.engine import FixedK
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.errors import SpecggufError
from specgguf.files.resolve import resolve_pair
from specgguf.prepare import LoadOptions, load_models
from specgguf.tuning import read_cost

QUESTIONS = [
    "Write a Python function that checks whether a number is prime.",
    "Now make it faster for large numbers.",
    "Add type hints and a docstring.",
    "Write two pytest tests for it.",
    "Explain its time complexity in two sentences.",
]


def _first_token(session: ChatSession, question: str, *, to_the_end: bool) -> Turn:
    reply = session.ask(question)
    for _ in reply:
        if not to_the_end and reply.turn.first_token_seconds is not None:
            break
    return reply.finish()


def measure(session: ChatSession, questions: list[str]) -> list[dict]:
    """Both ways, on the same loaded models; returns one row per turn."""
    _first_token(session, "Hi!", to_the_end=True)  # warm-up: page in the weights
    session.reset()
    session.forget_caches()
    turns = [_first_token(session, question, to_the_end=True) for question in questions]
    rows = [
        {
            "turn": n,
            "prompt_tokens": turn.n_prompt,
            "evaluated": turn.n_evaluated["verifier"],
            "ttft_reuse": turn.first_token_seconds,
            "answer_tokens": len(turn.answer_tokens),
        }
        for n, turn in enumerate(turns, start=1)
    ]
    for row, n in zip(rows, range(len(turns))):
        session.reset()
        session.transcript = list(turns[:n])  # the same history, re-evaluated from scratch
        session.forget_caches()
        cold = _first_token(session, turns[n].question, to_the_end=False)
        row["ttft_no_reuse"] = cold.first_token_seconds
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/chat_ttft.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", "--model", type=Path)
    parser.add_argument("-md", "--model-draft", type=Path)
    parser.add_argument("-k", "--draft-max", type=int, help="fixed K (default: the pair's, else 8)")
    parser.add_argument("-n", "--max-tokens", type=int, default=96, help="tokens per answer")
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    try:
        resolved = resolve_pair(model=args.model, model_draft=args.model_draft, pair=args.pair)
        verifier, draft, _ = load_models(
            resolved, LoadOptions(n_ctx=args.ctx_size, n_threads=args.threads), need_draft=True
        )
        k = args.draft_max if args.draft_max is not None else (resolved.recommended_k or 8)
        session = ChatSession(
            verifier=verifier,
            draft=draft,
            drafter=ModelDrafter(draft) if draft else None,
            policy=FixedK(k, read_seconds=read_cost(draft) if draft else None),
            k_source=f"K={k}",
            max_tokens=args.max_tokens,
            settings=SamplingSettings(temperature=0),
            seed=0,
        )
        rows = measure(session, QUESTIONS)
    except SpecggufError as error:
        print(f"specgguf: error: {error}", file=sys.stderr)
        return error.exit_code
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{resolved.name or resolved.verifier.name} · K={k} · greedy · {args.max_tokens} tokens per answer")
    print(f"{'turn':>4}  {'prompt':>6}  {'evaluated':>9}  {'TTFT reused':>11}  {'TTFT from scratch':>17}")
    for row in rows:
        print(
            f"{row['turn']:>4}  {row['prompt_tokens']:>6}  {row['evaluated']:>9}  {row['ttft_reuse']:>9.3f} s"
            f"  {row['ttft_no_reuse']:>15.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
