"""A draft model's reading of a long prompt, paired in one process: the engine's rule (core/drafting.py:
the draft reads once the answer has taken as long as the reading would) against reading at once and
drafting from the first step. Times to the first token and to the answer's end; each run starts from
empty caches, as a new request; the two sides alternate.

    .venv/bin/python scripts/first_token.py [--turns 3 | --suite KIND] [--repeats 3] [-n 48]

The prompts are the agent trace's first turns (specgguf/bench/traces/agent.jsonl, with its tools) or
the benchmark suite's prompts of one kind (--suite edit), rendered by the verifier's chat template;
greedy, the draft model alone (no prompt lookup, which would draft while the model waits) at a fixed K."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import specgguf.core.engine as engine
from specgguf.bench.machine import cpu
from specgguf.bench.suite import load_suite
from specgguf.bench.trace_servers import run_script  # noqa: E402
from specgguf.bench.traces import load_trace
from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.errors import SpecggufError
from specgguf.files.resolve import resolve_pair
from specgguf.llama.model import LlamaModel


def run(verifier: LlamaModel, draft: LlamaModel, prompt: list[int], n: int, k: int) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the answer's end, its tokens) from empty caches."""
    verifier.rewind(0)
    draft.rewind(0)
    start, first, count = time.perf_counter(), None, 0
    events = speculate(
        verifier=verifier,
        drafter=ModelDrafter(draft),
        prompt_tokens=prompt,
        k=FixedK(k),
        max_tokens=n,
        settings=SamplingSettings(temperature=0.0),
        rng=np.random.default_rng(0),
    )
    for event in events:
        count += len(event.tokens)
        first = first or time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, count


def prompts(verifier: LlamaModel, args: argparse.Namespace) -> list[list[int]]:
    """The agent trace's first turns (with their tools), or the suite's prompts of a kind, rendered."""
    if args.suite:
        chats = [([{"role": "user", "content": p.text}], None) for p in load_suite() if p.kind == args.suite]
        if not chats:
            raise SpecggufError(f"the suite has no prompts of kind {args.suite!r}")
    else:
        chats = [(r.body["messages"], r.body.get("tools")) for r in load_trace("agent").requests[: args.turns]]
    return [verifier.tokenize(verifier.apply_chat_template(messages, tools)) for messages, tools in chats]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-md", help="the draft GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=2)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("-n", type=int, default=48, help="tokens an answer")
    parser.add_argument("--turns", type=int, default=3, help="the agent trace's first N turns")
    parser.add_argument("--suite", metavar="KIND", help="the benchmark suite's prompts of this kind instead")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    machine = cpu()
    vnni = "yes" if machine["avx512_vnni"] else "no"
    print(f"CPU: {machine['cpu']} ({machine['cores']} cores), avx512_vnni: {vnni}, -t {args.t}")
    pair = resolve_pair(model=args.m, model_draft=args.md, pair=None)
    if pair.draft is None:
        raise SpecggufError("give -md DRAFT with -m")
    verifier = LlamaModel(pair.verifier, n_ctx=4096, n_threads=args.t)
    draft = LlamaModel(pair.draft, n_ctx=4096, n_threads=args.t)
    rule, sides = engine.Reading.__dict__["after_prefill"], ("the reading rule", "reading at once")
    at_once = classmethod(lambda cls, seconds, n_read, measured=None: cls(0.0))
    for prompt in prompts(verifier, args):
        times: dict[str, list[tuple[float, float, int]]] = {side: [] for side in sides}
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                setattr(engine.Reading, "after_prefill", rule if side == sides[0] else at_once)  # noqa: B010
                times[side].append(run(verifier, draft, prompt, args.n, args.k))
        setattr(engine.Reading, "after_prefill", rule)  # noqa: B010
        n_answer = times[sides[0]][0][2]
        print(f"\n{len(prompt)} prompt tokens, {n_answer} answer tokens, K {args.k}, {args.repeats} repeats (medians)")
        for side in sides:
            first = statistics.median(t[0] for t in times[side])
            total = statistics.median(t[1] for t in times[side])
            print(f"  {side:>28}: first token {first:6.2f} s, answer {total:6.2f} s")
        ratio = [a[0] / b[0] for a, b in zip(times[sides[0]], times[sides[1]])]
        whole = [a[1] / b[1] for a, b in zip(times[sides[0]], times[sides[1]])]
        print(f"  rule / at once: first token {statistics.median(ratio):.2f}x, answer {statistics.median(whole):.2f}x")


if __name__ == "__main__":
    run_script(main)  # with the program's huge pages, an error one line
