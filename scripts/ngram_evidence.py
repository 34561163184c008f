"""How often a prompt-lookup (n-gram) draft is right, by its evidence, on the benchmark suite.

Decodes each suite prompt greedily with the verifier alone (plain steps), then replays prompt lookup at
every position of the answer: the longest suffix n-gram (up to --max-ngram) of prompt + answer so far
found earlier, where it was found (the prompt or the answer), how many of its earlier occurrences agree
on the next token, and how many of its proposed tokens the verifier's greedy answer continues with
(what a greedy verify would accept). Counts only, no timing, so it may run on a busy machine.
`--trace chat` does the same over a shipped trace's chat turns, each after its own greedy answers to
the turns before, with where each match's continuation lies: the latest message (`new`), the
conversation's earlier turns (`history`) or the answer so far (`answer`).

    .venv/bin/python scripts/ngram_evidence.py -m VERIFIER.gguf -n 128 --out /tmp/evidence.json
    .venv/bin/python scripts/ngram_evidence.py -m VERIFIER.gguf --trace chat
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgguf.bench.suite import load_suite  # noqa: E402
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.bench.traces import CHAT, TraceRequest, load_trace  # noqa: E402
from specgguf.conversation import Prompts  # noqa: E402
from specgguf.core.drafting import NoDrafter, common_prefix  # noqa: E402
from specgguf.core.engine import FixedK, speculate  # noqa: E402
from specgguf.core.sampling import SamplingSettings  # noqa: E402
from specgguf.llama.loaded import ModelSettings  # noqa: E402
from specgguf.serve.apis.openai.bodies import ChatRequest  # noqa: E402


def answer_with_confidence(verifier, tokens: list[int], n: int) -> tuple[list[int], list[float]]:
    """The verifier's greedy answer alone, and its probability for each token it wrote (T 1 softmax)."""
    out: list[int] = []
    chances: list[float] = []
    for event in speculate(
        verifier=verifier,
        drafter=NoDrafter(),
        prompt_tokens=tokens,
        k=FixedK(0),
        max_tokens=n,
        settings=SamplingSettings(temperature=0.0),
        rng=np.random.default_rng(0),
    ):
        for token, row in zip(event.tokens, event.target_logits if event.target_logits is not None else []):
            row = row.astype(np.float64)
            chances.append(float(1.0 / np.exp(row - row[token]).sum()))
        out += event.tokens
    return out, chances


def answer(verifier, tokens: list[int], n: int) -> list[int]:
    return answer_with_confidence(verifier, tokens, n)[0]


def replay(prompt: list[int], reply: list[int], *, max_ngram: int, min_ngram: int, k: int) -> list[dict]:
    """One record per answer position t: the lookup's evidence and how many drafts greedy keeps."""
    records = []
    for t in range(len(reply) - 1):
        history = np.asarray(prompt + reply[:t], dtype=np.int64)
        truth = reply[t : t + k]
        for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(history[:-1], n)
            hits = np.flatnonzero((windows == history[-n:]).all(axis=1))
            hits = hits[hits + n < len(history)]
            if not hits.size:
                continue
            start = int(hits[-1]) + n
            draft = history[start : start + k].tolist()
            followers = history[hits + n]
            agree = int((followers == history[start]).sum())
            kept = 0
            for ours, theirs in zip(draft, truth):
                if ours != theirs:
                    break
                kept += 1
            records.append(
                {
                    "t": t,
                    "n": n,
                    "in_answer": start >= len(prompt),
                    "start": start,
                    "hits": int(hits.size),
                    "agree": agree,
                    "draft": len(draft),
                    "kept": kept,
                }
            )
            break
    return records


def summary(records: list[dict], key) -> dict:
    classes: dict = defaultdict(lambda: np.zeros(3))
    for record in records:
        row = classes[key(record)]
        row += [1, record["kept"] >= 1, min(record["kept"], record["draft"])]
    return {str(name): [int(r[0]), round(r[1] / r[0], 3), round(r[2] / r[0], 2)] for name, r in sorted(classes.items())}


def by_effective_length(records: list[dict], cap: int = 8, key=lambda record: "") -> dict:
    """Draft j of a proposal continues a match of n + j tokens once drafts 0..j-1 were right: how often
    such a draft is right, by that length (capped), the MATCH_PRIORS of core/ngram_drafter.py."""
    tested: dict = defaultdict(int)
    right: dict = defaultdict(int)
    for record in records:
        for j in range(min(record["kept"] + 1, record["draft"])):
            name = (key(record), min(record["n"] + j, cap))
            tested[name] += 1
            right[name] += j < record["kept"]
    return {str(name): [tested[name], round(right[name] / tested[name], 3)] for name in sorted(tested)}


def greedy_turns(
    verifier, requests: Sequence[TraceRequest], answers: Sequence[str] | None = None
) -> Iterator[tuple[int, list[int], int, list[int]]]:
    """A trace's chat turns, each after the verifier's own greedy answers to the ones before (as a server
    replaying it with its own history), or after `answers` (a server's, one per chat turn, each the
    answer's tokens as the verifier tokenizes its text): (the request's index, the turn's prompt tokens,
    where its latest message starts in them, the answer)."""
    prompts = Prompts(verifier)
    history: list[dict] = []
    given = iter(answers) if answers is not None else None
    for index, request in enumerate(requests):
        if request.path != CHAT:
            continue
        body = request.body
        listed = [*history, *body["messages"]] if request.replay_history else list(body["messages"])
        # Read as the server reads it: tool calls, tool results and the tools in the prompt (an agent's).
        chat = ChatRequest.model_validate_json(json.dumps({**body, "messages": listed}))
        messages, plan = chat.template_messages(), chat.tool_plan()
        tools = None if plan is None else plan.in_prompt
        tokens = prompts.chat_tokens(messages, tools)
        before = prompts.chat_tokens(messages[:-1], tools) if len(messages) > 1 else []
        new = common_prefix(before, tokens)  # where the latest message starts
        verifier.rewind(0)
        if given is not None:
            reply = verifier.tokenize(next(given), special=False)
        else:
            reply = answer(verifier, tokens, body.get("max_tokens", 256))
        text = b"".join(verifier.token_bytes(token) for token in reply if not verifier.is_eog(token))
        history = [*listed, {"role": "assistant", "content": text.decode("utf-8", errors="replace")}]
        print(f"turn {index}: prompt {len(tokens)} (new from {new}), answer {len(reply)}", file=sys.stderr, flush=True)
        yield index, tokens, new, reply


def trace_records(verifier, requests: Sequence[TraceRequest], *, max_ngram: int) -> list[dict]:
    """`replay`'s records over a trace's chat turns (`greedy_turns`), each with where its match's
    continuation lies: "new" (the latest message, with what the template adds), "history" or "answer"."""
    records = []
    for index, tokens, new, reply in greedy_turns(verifier, requests):
        for record in replay(tokens, reply, max_ngram=max_ngram, min_ngram=2, k=8):
            place = "answer" if record["in_answer"] else "new" if record["start"] >= new else "history"
            records.append(record | {"turn": index, "where": place})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--max-ngram", type=int, default=8)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--replay", type=Path, help="only summarise an --out file written before")
    parser.add_argument("--trace", help="a shipped trace's chat turns (chat, agent) instead of the suite")
    args = parser.parse_args()
    if args.replay:
        records = [r for entry in json.loads(args.replay.read_text()) for r in entry["records"]]
        print("each draft by the match it continues [tested, right]:", by_effective_length(records))
        print("... in the prompt or the answer:", by_effective_length(records, key=lambda r: r["in_answer"]))
        return
    if args.trace:
        requests = load_trace(args.trace).requests  # a bad name fails before the model loads
        verifier = ModelSettings(n_ctx=8192, n_threads=args.threads).load(Path(args.model))
        records = trace_records(verifier, requests, max_ngram=args.max_ngram)
        if args.out:
            args.out.write_text(json.dumps(records))
        print("by where, first draft [count, first kept, mean kept]:", summary(records, lambda r: r["where"]))
        where = lambda r: r["where"] + ("" if r["agree"] == r["hits"] else ", disagreed")  # noqa: E731
        print(
            "each draft by where and the match it continues [tested, right]:", by_effective_length(records, key=where)
        )
        return
    verifier = ModelSettings(n_ctx=4096, n_threads=args.threads).load(Path(args.model))
    prompts = Prompts(verifier)
    everything: list[dict] = []
    for item in load_suite():
        tokens = prompts.question(item.text, raw=False, system=None)
        reply = answer(verifier, tokens, args.n)
        records = replay(tokens, reply, max_ngram=args.max_ngram, min_ngram=2, k=8)
        everything.append(
            {"name": item.name, "kind": item.kind, "prompt_tokens": len(tokens), "reply": reply, "records": records}
        )
        print(item.name, len(tokens), len(reply), summary(records, lambda r: r["n"]), file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text(json.dumps(everything))
    records = [r for entry in everything for r in entry["records"]]
    print("by n [count, first kept, mean kept]:", summary(records, lambda r: r["n"]))
    print("by where:", summary(records, lambda r: "answer" if r["in_answer"] else "prompt"))
    print("by agreement:", summary(records, lambda r: (min(r["hits"], 3), r["agree"] == r["hits"])))
    print("each draft by the match it continues [tested, right]:", by_effective_length(records))
    print("... in the prompt or the answer:", by_effective_length(records, key=lambda r: r["in_answer"]))


if __name__ == "__main__":
    run_script(main)
