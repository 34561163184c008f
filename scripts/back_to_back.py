"""Short requests sent back to back, as a pipeline or an editor sends them: each request's time as the
client sees it, `specgguf serve` against llama-server (plain) or against another checkout's server.

Three kinds, each answered whole (not streamed): an embedding of one sentence, a one-token chat answer,
and the editor trace's last `/infill` with its prompt cached and one token to write. Each server gets
`--repeats` rounds of `--requests` requests of a kind, the servers taking turns round by round (ABBA);
the medians and their ratio are printed with the machine. A fixed cost per request (HTTP, the prompt's
set-up, a response that waits on the network) shows here, where a long answer would hide it.

    python scripts/back_to_back.py --vs-llama-server build/llama.cpp/bin/llama-server
    python scripts/back_to_back.py --b-checkout ../before    # a git worktree: the same server before a change
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from specgguf.bench.llama_tools import LlamaTools
from specgguf.bench.machine import cpu, machine_lines, machine_report
from specgguf.bench.trace_servers import (
    PairSettings,
    from_checkout,
    llama_server_specs,
    run_script,
    running,
    specgguf_spec,
)
from specgguf.bench.traces import load_trace
from specgguf.errors import SpecggufError
from specgguf.files.resolve import resolve_pair


def kinds() -> list[tuple[str, str, dict[str, Any]]]:
    """(what, path, body) of each kind of request."""
    infill = dict(load_trace("editor").requests[-1].body)
    infill.pop("t_max_predict_ms", None)
    infill |= {"n_predict": 1, "temperature": 0, "cache_prompt": True, "stream": False}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0, "stream": False}
    return [
        ("/v1/embeddings, one sentence", "/v1/embeddings", {"input": "the cat sat on the mat"}),
        ("/v1/chat/completions, 1 token", "/v1/chat/completions", chat),
        ("/infill, prompt cached, 1 token", "/infill", infill),
    ]


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> None:
    try:
        response = client.post(url, json=body)
    except httpx.HTTPError as error:  # a server that died or stopped answering: one line
        raise SpecggufError(f"{url}: {type(error).__name__}: {error}") from None
    if response.status_code != 200:
        raise SpecggufError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    against = parser.add_mutually_exclusive_group(required=True)
    against.add_argument(
        "--vs-llama-server",
        type=Path,
        help="llama-server (B: plain; mean pooling, as serve's)",
    )
    against.add_argument("--b-checkout", type=Path, help="B: `specgguf serve` from this checkout's package")
    parser.add_argument("-m", help="the verifier GGUF (default: the default pair's)")
    parser.add_argument("-md", help="the draft GGUF (default: the default pair's)")
    parser.add_argument("-t", type=int, default=2, help="threads, for both servers")
    parser.add_argument("-c", type=int, default=4096, help="context size, for both servers")
    parser.add_argument("--requests", type=int, default=10, help="requests a round")
    parser.add_argument("--repeats", type=int, default=4, help="rounds a server, taking turns")
    args = parser.parse_args()
    resolved = resolve_pair(model=args.m, model_draft=args.md, pair=None)
    if resolved.draft is None:
        parser.error("give -md DRAFT with -m")
    pair = PairSettings(resolved.verifier, resolved.draft, args.t, args.c)
    specs = [specgguf_spec(pair, name="A: specgguf serve")]
    if args.vs_llama_server is not None:
        plain = llama_server_specs(args.vs_llama_server, pair, draft_ks=[], ngram_types=[])[0]
        embeddings = ("--embeddings", "--pooling", "mean")  # mean: as serve pools a generative model
        specs.append(dataclasses.replace(plain, name="B: llama-server", command=plain.command + embeddings))
        tools = LlamaTools.find(args.vs_llama_server.parent, option="--vs-llama-server")
        report = machine_report(tools, [("verifier", pair.verifier)], args.t)
    else:
        specs.append(from_checkout(specs[0], args.b_checkout, f"B: specgguf serve from {args.b_checkout}"))
        report = {**cpu(), "threads": args.t, "llama_bench": {}}
    print(machine_lines(report))
    with running(specs) as servers, httpx.Client(timeout=300) as client:
        for what, path, body in kinds():
            times: list[list[float]] = [[] for _ in servers]
            for server in servers:  # a warm-up each: the prompt cached, the first request's costs paid
                _post(client, server.base_url + path, body)
            for round_ in range(args.repeats):
                order = list(enumerate(servers))
                for index, server in order if round_ % 2 == 0 else order[::-1]:
                    for _ in range(args.requests):
                        start = time.perf_counter()
                        _post(client, server.base_url + path, body)
                        times[index].append((time.perf_counter() - start) * 1000)
            a, b = (statistics.median(found) for found in times)
            print(f"{what}: A {a:.1f} ms, B {b:.1f} ms a request (median), A ÷ B {a / b:.2f}×", flush=True)


if __name__ == "__main__":
    run_script(main)
