"""Where two servers' greedy answers to a trace part, and by how much the verifier's own logits part them.

Issue 46 asks for every greedy answer to equal llama-server's plain answer, or, where llama.cpp's batch
sizes make the logits differ, to be the verifier's own argmax at every step. Two servers that both take
the argmax still part where the two best tokens are within the logits' batch-to-batch wobble: the server
that decodes a token a pass and the one that verifies drafts in batches of K + 1 rows compute the same
row with other shapes. This reads a `scripts/bench_traces.py --json` run, and for each answer that
`differs` from the reference's with the same history before it, renders its prompt as `specgguf serve`
does (the chat template, or the FIM framing of an `/infill` body), tokenizes both answers, finds the first
token where they part, and scores that position with the verifier, two ways:

- `one pass`: the prompt and the common tokens read in one pass (a prompt pass's shape);
- `by tokens`: the prompt in one pass, then the common tokens one a pass (plain decoding's shape);

printing, for each way, the two servers' tokens' logits and which is the argmax. The parting is a
near-tie when the two logits are within `--margin` of each other in either way (or the argmax flips
between them); a wide gap with the other server's token on top is a real difference to look into.

    .venv/bin/python scripts/bench_traces.py --vs-llama-server build/llama.cpp/bin/llama-server \
        --trace editor --spec-draft-n-max "" --ngram-types "" -t 2 --json /tmp/editor.json
    .venv/bin/python scripts/trace_ties.py --json /tmp/editor.json -t 2

The verifier is the default pair's unless -m names it; the context size must be the run's (-c), since an
`/infill` prompt's room for `input_extra` depends on it. Retokenizing an answer's text may not give the
tokens the server generated where the text could be split another way; the common tokens are where both
answers' retokenizations agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgguf.bench.traces import CHAT, TraceRequest, load_trace  # noqa: E402
from specgguf.conversation import Prompts, fill_in_middle  # noqa: E402
from specgguf.errors import SpecggufError  # noqa: E402
from specgguf.files.resolve import resolve_pair  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402
from specgguf.serve.apis.infill import InfillBody  # noqa: E402
from specgguf.serve.apis.openai.bodies import ChatRequest  # noqa: E402
from specgguf.serve.common import ApiError, parse_body  # noqa: E402

SERVE_MAX_TOKENS = 512  # `specgguf serve -n`'s default: an /infill request's n_predict -1 or none


@dataclass(frozen=True)
class Parting:
    """Where two answers' tokens part: the tokens both wrote, then each one's next (None: it ended)."""

    common: list[int]
    reference: int | None
    other: int | None


def parting(reference: list[int], other: list[int]) -> Parting:
    n = 0
    while n < min(len(reference), len(other)) and reference[n] == other[n]:
        n += 1
    at = lambda tokens: tokens[n] if n < len(tokens) else None  # noqa: E731
    return Parting(reference[:n], at(reference), at(other))


def prompt_tokens(
    prompts: Prompts, model: LlamaModel, request: TraceRequest, history: list[dict], n_ctx: int
) -> list[int]:
    """The request's prompt as specgguf serve renders it, after `history` (a replay's): its body read by
    the server's own request models (serve/apis), its messages and tools as the chat template gets them,
    an /infill body framed with its chunks (serve/plan.py)."""
    body = request.body | ({"messages": [*history, *request.body["messages"]]} if request.path == CHAT else {})
    try:
        if request.path == "/infill":
            framing = model.fim_tokens()
            if framing is None:
                raise SpecggufError("this verifier has no FIM tokens; the trace's /infill requests need them")
            infill = parse_body(InfillBody, json.dumps(body).encode())
            n_predict = max(1, infill.limit(SERVE_MAX_TOKENS))  # as the route's Limits
            return fill_in_middle(prompts, infill.fim_request(), framing, n_ctx=n_ctx, n_predict=n_predict)
        if request.path == CHAT:
            chat = parse_body(ChatRequest, json.dumps(body).encode())
            plan = chat.tool_plan()
            return prompts.chat_tokens(chat.template_messages(), None if plan is None else plan.in_prompt)
    except ApiError as error:
        raise SpecggufError(f"trace line {request.line}: {error.message}") from None
    raise SpecggufError(f"{request.path}: only /infill and chat requests are checked here")


def scores(model: LlamaModel, prompt: list[int], common: list[int]) -> dict[str, np.ndarray]:
    """The row that scores what follows prompt + common, computed in one pass and token by token."""
    model.rewind(0)
    one_pass = np.array(model.eval([*prompt, *common], n_logits=1)[-1], dtype=np.float64)
    model.rewind(0)
    row = model.eval(prompt, n_logits=1)[-1]
    for token in common:
        row = model.eval([token], n_logits=1)[-1]
    return {"one pass": one_pass, "by tokens": np.array(row, dtype=np.float64)}


def verdict(rows: dict[str, np.ndarray], split: Parting, margin: float) -> tuple[str, list[str]]:
    """('near-tie' | 'differs' | 'ended', a line per way of computing the row)."""
    if split.reference is None or split.other is None:
        return "ended", [f"  one answer ends where the other goes on ({len(split.common)} tokens in common)"]
    lines, gaps, tops = [], [], set()
    for way, row in rows.items():
        top = int(np.argmax(row))
        tops.add(top)
        gap = float(row[split.reference] - row[split.other])
        gaps.append(abs(gap))
        lines.append(
            f"  {way:9}: reference's {row[split.reference]:8.3f}  other's {row[split.other]:8.3f}  gap {gap:+.3f}"
            f"  argmax {'reference' if top == split.reference else 'other' if top == split.other else top}"
        )
    near = min(gaps) <= margin or {split.reference, split.other} <= tops
    return ("near-tie" if near else "differs"), lines


def load_run(path: Path) -> dict[str, Any]:
    """A bench_traces.py --json run, checked for what this reads; a bad one is a SpecggufError."""
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecggufError(f"{path}: not a bench_traces.py --json run ({error})") from None
    bad = SpecggufError(f"{path}: not a bench_traces.py --json run (traces, requests, servers, text)")
    try:
        for report in run["traces"]:
            for entry in report["requests"]:
                if not isinstance(entry["index"], int) or entry["index"] < 1:
                    raise bad
                if not all(isinstance(reply["text"], str) for reply in entry["servers"].values()):
                    raise bad
    except (KeyError, TypeError, AttributeError):
        raise bad from None
    return run


def _piece(model: LlamaModel, token: int | None) -> str:
    return "end" if token is None else repr(model.token_bytes(token).decode("utf-8", "replace"))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="a scripts/bench_traces.py --json run")
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=2, help="threads")
    parser.add_argument("-c", type=int, default=8192, help="the run's context size")
    parser.add_argument("--margin", type=float, default=0.25, help="logits this close are a near-tie")
    parser.add_argument("--trace-file", action="append", default=[], help="NAME=PATH where a trace is not shipped")
    return parser.parse_args()


def main() -> int:
    args = arguments()
    run = load_run(args.json)
    paths = dict(entry.split("=", 1) for entry in args.trace_file)
    model_path = Path(args.m) if args.m else resolve_pair(model=None, model_draft=None, pair=None).verifier
    model = LlamaModel(model_path, n_ctx=args.c, n_threads=args.t)
    prompts = Prompts(model)
    counts: dict[str, int] = {}
    for report in run["traces"]:
        trace = load_trace(paths.get(report["trace"], report["trace"]))
        history: list[dict] = []
        for entry in report["requests"]:
            if entry["index"] > len(trace.requests):
                raise SpecggufError(f"{args.json}: request {entry['index']} is not in trace {trace.name!r}")
            request = trace.requests[entry["index"] - 1]
            replies = entry["servers"]
            reference = next(name for name, reply in replies.items() if reply["compared"] == "reference")
            for name, reply in replies.items():
                if reply["compared"] != "differs" or reply["history_differs"]:
                    continue
                prompt = prompt_tokens(prompts, model, request, history if request.replay_history else [], args.c)
                split = parting(
                    prompts.continuation(replies[reference]["text"], special=False),
                    prompts.continuation(reply["text"], special=False),
                )
                kind, lines = verdict(scores(model, prompt, split.common), split, args.margin)
                counts[kind] = counts.get(kind, 0) + 1
                print(
                    f"{report['trace']} request {entry['index']} ({name} against {reference}): {kind}, at token"
                    f" {len(split.common)} of the answer ({len(prompt)} prompt tokens):"
                    f" {_piece(model, split.reference)} against {_piece(model, split.other)}"
                )
                print("\n".join(lines))
            if request.path == CHAT:  # the next replay's history: the reference's own (the same up to here)
                history = [*(history if request.replay_history else []), *request.body["messages"]]
                history.append({"role": "assistant", "content": replies[reference]["text"]})
    model.close()
    print("partings: " + (", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none to check"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecggufError as error:
        print(f"specgguf: error: {error}", file=sys.stderr)
        sys.exit(1)
