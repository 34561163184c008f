"""Replay client traces against `specgguf serve` and llama.cpp's `llama-server`, side by side, in one run.

    .venv/bin/python scripts/bench_traces.py --vs-llama-server build/llama.cpp/bin/llama-server
    .venv/bin/python scripts/bench_traces.py --trace editor --quick --vs-llama-server PATH

Starts llama-server plain (the reference), with the draft model at each --spec-draft-n-max, with each
of its n-gram speculation types, and `specgguf serve` (its defaults), all on the same pair, threads
and context; then replays each trace interleaved request by request (bench/trace_replay.py) and
prints a line per request and server and the totals (bench/trace_report.py), after the CPU and
llama-bench's verify curve (bench/machine.py). Without --vs-llama-server (or when it is not there)
only specgguf serve runs, and it says so. docs/benchmarks.md ("Traces") explains the columns.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from specgguf.bench import machine
from specgguf.bench.llama_tools import COMPLETION, SPECULATIVE, LlamaTools
from specgguf.bench.trace_replay import replay
from specgguf.bench.trace_report import report_json, row_lines, total_lines
from specgguf.bench.trace_servers import (
    PairSettings,
    llama_server_specs,
    run_script,
    running,
    spec_types,
    specgguf_spec,
)
from specgguf.bench.traces import SHIPPED, load_trace
from specgguf.errors import SpecggufError
from specgguf.files.resolve import resolve_pair
from specgguf.llama import huge_pages

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
QUICK_REQUESTS = 5


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace", action="append", help=f"a shipped trace ({', '.join(SHIPPED)}) or a file; repeatable"
    )
    parser.add_argument("--vs-llama-server", type=Path, help="the llama-server program (docs/llama-cpp.md)")
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-md", help="the draft GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=os.cpu_count() or 2, help="threads, for every server")
    parser.add_argument("-c", type=int, default=8192, help="context size, for every server")
    parser.add_argument("--spec-draft-n-max", default="4,8", help="llama-server -md at each of these K (empty: none)")
    parser.add_argument(
        "--ngram-types",
        default=",".join(NGRAM_TYPES),
        help="llama-server's n-gram --spec-type values to run (those it has)",
    )
    parser.add_argument("--requests", type=int, help="only the first N requests of each trace")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_REQUESTS} requests a trace, plain and -md at the first K only"
    )
    parser.add_argument(
        "--honour-gaps", action="store_true", help="sleep each request's gap_s before it (default: none)"
    )
    parser.add_argument("--as-sent", action="store_true", help="keep each body's sampling (default: greedy, compared)")
    parser.add_argument("--no-llama-bench", action="store_true", help="skip llama-bench -p 1,2,4,8")
    parser.add_argument(
        "--llama-server-huge-pages",
        action="store_true",
        help="run llama.cpp's programs with the huge pages and load mode specgguf gives itself"
        " (default: as users run them; docs/benchmarks.md)",
    )
    parser.add_argument("--json", type=Path, help="also write every request's figures and answers here")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    traces = [load_trace(name) for name in args.trace or SHIPPED]
    n_requests = args.requests if args.requests is not None else QUICK_REQUESTS if args.quick else None
    traces = [trace.cut(n_requests) for trace in traces]
    resolved = resolve_pair(model=args.m, model_draft=args.md, pair=None)
    if resolved.draft is None:
        raise SpecggufError("give -md DRAFT with -m (llama-server -md and specgguf serve need a draft)")
    pair = PairSettings(resolved.verifier, resolved.draft, args.t, args.c)
    try:
        ks = [int(k) for k in args.spec_draft_n_max.split(",") if k.strip()]
    except ValueError:
        raise SpecggufError(f"--spec-draft-n-max takes numbers like 4,8, got {args.spec_draft_n_max!r}") from None
    if n_requests is not None and n_requests < 1 or any(k < 1 for k in ks):
        raise SpecggufError("--requests and --spec-draft-n-max take numbers from 1")
    program = args.vs_llama_server
    specs, bench = [], {}
    if program is None or not program.is_file():
        print(f"no llama-server ({program or 'give --vs-llama-server PATH'}): specgguf serve alone", file=sys.stderr)
    else:
        known = spec_types(program)
        wanted = [kind for kind in args.ngram_types.split(",") if kind.strip()]
        missing = [kind for kind in wanted if kind not in known]
        if missing:
            print(f"this llama-server has no --spec-type {', '.join(missing)}: left out", file=sys.stderr)
        ngrams = [] if args.quick else [kind for kind in wanted if kind in known]
        specs = llama_server_specs(program, pair, draft_ks=ks[:1] if args.quick else ks, ngram_types=ngrams)
        if args.llama_server_huge_pages:
            pages = tuple(huge_pages.for_llama_cpp({}, same_as_ours=True).items())
            specs = [dataclasses.replace(spec, environment=spec.environment + pages) for spec in specs]
        tools = LlamaTools(
            program.parent,
            program.parent / COMPLETION,
            program.parent / SPECULATIVE,
            same_pages=args.llama_server_huge_pages,
        )
        if not args.no_llama_bench:
            bench = {pair.verifier.name: machine.llama_bench(tools, pair.verifier, args.t)}
    ours = huge_pages.program_environment()  # specgguf serve's, started as a process: not this script's
    report = {**machine.cpu(), **machine.pages(llama_cpp_same=args.llama_server_huge_pages, ours=ours)}
    print(machine.machine_lines({**report, "threads": args.t, "llama_bench": bench}), flush=True)
    specs.append(specgguf_spec(pair))
    reports = []
    with running(specs) as servers:
        for trace in traces:
            print(f"\n{trace.name}: {trace.description} ({len(trace.requests)} requests)", flush=True)
            rows = replay(
                trace,
                servers,
                greedy=not args.as_sent,
                honour_gaps=args.honour_gaps,
                on_row=lambda row: print("\n".join(row_lines(row)), flush=True),
            )
            print("\n".join(total_lines(trace.name, rows)), flush=True)
            reports.append(report_json(trace.name, rows))
            if args.json:  # after each trace: a run stopped later keeps what it measured
                document = {"servers": [spec.name for spec in specs], "traces": reports}
                args.json.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    run_script(main)
