"""Two `specgguf serve` settings replaying one trace, request by request (ABBA: odd requests A first, even B
first), each server with its own history (or both with A's: `--same-history`), greedy: what a change to a
default does on the work a client sends, without llama-server and without this machine's drift between
runs (bench_traces.py compares with llama-server). Per request, and in total: the server's generation
time (`timings.predicted_ms`), its tokens and drafts kept; with `--passes N`, the trace N times on fresh
servers (the pair's order turned each pass) and each request's median B÷A rate, where one pass's ±8% a
request would hide a few percent. Quiet machine only, one benchmark at a time:

    .venv/bin/python scripts/ab_traces.py --trace chat -m ~/.cache/specgguf/qwen2.5-coder-1.5b-instruct-f16.gguf \
        -md ~/.cache/specgguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --b "--draft-variant q4_0-q8head+hot32k"

`--b-checkout DIR` runs B's server from another checkout's package (a `git worktree` with a change in its
code), A's from this one: a change that has no option of its own, measured through both servers.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specgguf.bench.machine import cpu
from specgguf.bench.trace_replay import REQUEST_SECONDS, Transcript, prepared_body
from specgguf.bench.trace_servers import (
    PairSettings,
    ServerSpec,
    from_checkout,
    run_script,
    running,
    specgguf_spec,
)
from specgguf.bench.traces import CHAT, TraceRequest, load_trace
from specgguf.files.resolve import resolve_pair


@dataclass
class Totals:
    wall: float = 0.0
    prompt: float = 0.0
    generation: float = 0.0
    tokens: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)  # the chat history at the end

    @property
    def rate(self) -> float:
        """Tokens a second of generation (0 where none ran)."""
        return self.tokens / self.generation if self.generation else 0.0


def answer(client: httpx.Client, base_url: str, path: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """The wall time and the server's answer to one request, not streamed (its `timings` whole)."""
    started = time.perf_counter()
    response = client.post(base_url + path, json=body | {"stream": False}, timeout=REQUEST_SECONDS)
    response.raise_for_status()
    return time.perf_counter() - started, response.json()


def replay_one(
    client: httpx.Client, base_url: str, request: TraceRequest, transcript: Transcript, total: Totals
) -> tuple[str, float]:
    """One request to one server, after the history in `transcript` (its answer appended to it), counted
    into `total`: a line of its figures, and its generation's tokens a second (0 where none)."""
    body = prepared_body(request, transcript, greedy=True)
    wall, reply = answer(client, base_url, request.path, body)
    if request.path == CHAT:
        transcript.messages.append(reply["choices"][0]["message"])
    timings = reply.get("timings") or {}
    seconds, tokens = timings.get("predicted_ms", 0.0) / 1000, timings.get("predicted_n", 0)
    prompt_seconds = timings.get("prompt_ms", 0.0) / 1000
    total.wall, total.prompt = total.wall + wall, total.prompt + prompt_seconds
    total.generation, total.tokens = total.generation + seconds, total.tokens + tokens
    prompt = f"prompt {timings.get('prompt_n', 0):4d} read in {prompt_seconds:5.2f} s"
    drafts = f"drafts {timings.get('draft_n_accepted', 0)}/{timings.get('draft_n', 0)}"
    return f"{prompt}, {seconds:6.2f} s {tokens:4d} tokens, {drafts}", tokens / seconds if seconds > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="chat", help="a shipped trace (editor, agent, chat) or a file")
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-md", help="the draft GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=2)
    parser.add_argument("-c", type=int, default=8192)
    parser.add_argument("--a", default="", help="serve's options for A (default: none, its defaults)")
    parser.add_argument("--b", default="", help="serve's options for B (default: none)")
    parser.add_argument(
        "--b-checkout", type=Path, help="B's server runs the specgguf package of this checkout (a git worktree)"
    )
    parser.add_argument("--requests", type=int, help="only the first N requests")
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="the whole trace this many times, on fresh servers each (per request: the median ratio)",
    )
    parser.add_argument(
        "--same-history",
        action="store_true",
        help="a chat's history is A's answers for both (each server's own otherwise: greedy answers can part at"
        " a near-tie that the batch sizes decide, and then the turns after are other prompts)",
    )
    parser.add_argument("--save", type=Path, help="write A's chat history of the last pass here (JSON)")
    args = parser.parse_args()
    if args.passes < 1:
        parser.error("--passes must be 1 or more")
    resolved = resolve_pair(model=args.m, model_draft=args.md, pair=None)
    if resolved.draft is None:
        parser.error("give -md DRAFT with -m")
    settings = PairSettings(resolved.verifier, resolved.draft, args.t, args.c)
    specs = []
    for name, options in (("A", args.a), ("B", args.b)):
        base = specgguf_spec(settings, name=name)
        if name == "B" and args.b_checkout is not None:
            base = from_checkout(base, args.b_checkout, name)
        specs.append(ServerSpec(name, base.command + tuple(shlex.split(options)), base.environment))
    requests = load_trace(args.trace).cut(args.requests).requests  # (a bad name fails before any server starts)
    machine = cpu()
    print(f"CPU: {machine['cpu']} ({machine['cores']} cores, -t {args.t}), avx512_vnni: {machine['avx512_vnni']}")
    history = "A's history for both" if args.same_history else "each its own history"
    where = f" (the package in {args.b_checkout})" if args.b_checkout else ""
    print(f"A: {args.a or '(defaults)'}\nB: {args.b}{where}\n{args.trace}: {len(requests)} requests, ABBA, {history}")
    ratios: list[list[float]] = [[] for _ in requests]  # per request, B's rate ÷ A's in each pass
    for replay in range(args.passes):
        if args.passes > 1:
            print(f"pass {replay + 1} of {args.passes} (fresh servers)", flush=True)
        a, b = replay_pass(specs, requests, same_history=args.same_history, first=replay % 2, ratios=ratios)
        if a.rate and b.rate:
            print(f"B ÷ A, tokens a second of generation: {b.rate / a.rate:.3f}×")
    if args.save:  # the last pass's: what A answered, for policy_replay.py --trace NAME --history FILE
        args.save.write_text(json.dumps({"trace": args.trace, "messages": a.messages}))
    if args.passes > 1:
        print(f"per request, B ÷ A over the {args.passes} passes (median, least, most):")
        for index, found in enumerate(ratios, start=1):
            if found:
                print(f"#{index:<3} {statistics.median(found):.3f}×  {min(found):.3f}–{max(found):.3f}")


def replay_pass(
    specs: list[ServerSpec],
    requests: Sequence[TraceRequest],
    *,
    same_history: bool,
    first: int,
    ratios: list[list[float]],
) -> tuple[Totals, Totals]:
    """The trace once on fresh servers, request by request, A first on odd requests (B first where
    `first` is 1), each request's B÷A rate appended to `ratios`; A's and B's totals."""
    totals = {"A": Totals(), "B": Totals()}
    with running(specs) as servers, httpx.Client() as client:
        transcripts = {server.name: Transcript() for server in servers}
        for index, request in enumerate(requests, start=1):
            if same_history:  # both after A's answers so far: the same prompts, the same cache
                transcripts["B"] = Transcript(list(transcripts["A"].messages))
            order = servers if (index + first) % 2 else servers[::-1]
            parts = {
                server.name: replay_one(client, server.base_url, request, transcripts[server.name], totals[server.name])
                for server in order
            }
            if parts["A"][1] and parts["B"][1]:
                ratios[index - 1].append(parts["B"][1] / parts["A"][1])
            print(f"#{index:<3} A {parts['A'][0]} | B {parts['B'][0]}", flush=True)
    totals["A"].messages = transcripts["A"].messages
    for name, total in totals.items():
        print(
            f"{name}: wall {total.wall:.1f} s, prompts read in {total.prompt:.1f} s,"
            f" generation {total.generation:.1f} s for {total.tokens} tokens: {total.rate:.2f} tok/s"
        )
    return totals["A"], totals["B"]


if __name__ == "__main__":
    run_script(main)
