"""Where a request's time to first token goes: the prompt's pass, or the rest.

Replays a shipped trace's requests (bench/traces/) against llama-server (plain) and `specgguf serve`,
interleaved request by request, greedy, streamed. For each request: the client's time to the first
piece of text, the server's own `timings.prompt_ms` (both servers report it), and their difference,
the *overhead*: parsing, tokenizing, planning, whatever runs between the prompt's pass and the first
token, and the trip back. Each request is sent as the trace holds it (a chat line's history is not
replayed: bench_traces.py replays it). A request whose first step drafted before its first token
showed here as an overhead of a verify pass or more (docs/benchmarks.md, "Time to first token").

    python scripts/ttft_overhead.py --vs-llama-server build/llama.cpp/bin/llama-server --trace editor
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import httpx

from specgguf.bench import trace_servers
from specgguf.bench.trace_replay import Transcript, prepared_body, send
from specgguf.bench.traces import load_trace
from specgguf.files.resolve import resolve_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vs-llama-server", type=Path, required=True, help="the llama-server program")
    parser.add_argument("--trace", default="editor", help="a shipped trace (editor, agent, chat) or a trace file")
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-md", help="the draft GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=2, help="threads, for both servers")
    parser.add_argument("-c", type=int, default=4096, help="context size, for both servers")
    parser.add_argument("--requests", type=int, help="only the first N requests")
    args = parser.parse_args()
    resolved = resolve_pair(model=args.m, model_draft=args.md, pair=None)
    if resolved.draft is None:
        parser.error("give -md DRAFT with -m")
    trace = load_trace(args.trace).cut(args.requests)  # (a bad name fails before any server starts)
    pair = trace_servers.PairSettings(resolved.verifier, resolved.draft, args.t, args.c)
    specs = trace_servers.llama_server_specs(args.vs_llama_server, pair, draft_ks=[], ngram_types=[])
    specs.append(trace_servers.specgguf_spec(pair))
    overheads: list[list[float]] = [[] for _ in specs]
    ratios = []
    with trace_servers.running(specs) as servers, httpx.Client() as client:
        for index, request in enumerate(trace.requests, start=1):
            replies = [
                send(client, server.base_url, request.path, prepared_body(request, Transcript(), greedy=True))
                for server in servers
            ]
            known = [
                (r.ttft_s * 1000, r.prompt_ms) for r in replies if r.ttft_s is not None and r.prompt_ms is not None
            ]
            if len(known) < len(replies):
                continue  # no text (a warm-up), no timings, or an error
            row = [ttft - prompt for ttft, prompt in known]
            for column, overhead in zip(overheads, row):
                column.append(overhead)
            ratios.append(known[-1][0] / known[0][0])
            cells = "  ".join(f"ttft {ttft:7.1f} ms, prompt {prompt:7.1f}" for ttft, prompt in known)
            print(f"{index:3}  {cells}  overhead " + " / ".join(f"{o:5.1f}" for o in row), flush=True)
    if not ratios:
        parser.exit(1, "specgguf: error: no request had text and timings from every server\n")
    for server, column in zip(servers, overheads):
        print(
            f"{server.name}: overhead median {statistics.median(column):.1f} ms, max {max(column):.1f} ms,"
            f" over 20 ms on {sum(o > 20 for o in column)} of {len(column)}"
        )
    print(
        f"specgguf ttft ÷ llama-server's: median {statistics.median(ratios):.3f}, ≤ 1 on {sum(r <= 1 for r in ratios)}"
    )


if __name__ == "__main__":
    trace_servers.run_script(main)
