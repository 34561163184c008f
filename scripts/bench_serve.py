"""What HTTP costs: `python scripts/bench_serve.py [--pair NAME | -m V -md D] -k 4 -t 2`.

For each repeat and prompt, interleaved so machine noise hits both sides alike:
`specgguf run --json` (a fresh process; its tokens/s leave out loading and the
prompt), then the same request streamed through one running `specgguf serve` with
the openai SDK. The server side is timed by the client, from sending the request
to the last chunk, less the server's own prompt time (`timings.prompt_ms`), so
both sides count generation only and the HTTP, JSON and SSE costs land on the
server's side. Greedy with a fixed K: both sides generate the same tokens (checked).
`overhead` compares the client's timing of a request with the server's own
(`timings.predicted_per_second`) for the very same generation: what HTTP adds,
free of the run-to-run noise that the `ratio` to a separate `run` carries.
Then 4 clients at once: the total tokens/s and the mean time to first token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from specgguf.bench.measure import PROMPTS

SPECGGUF = [sys.executable, "-m", "specgguf"]


def _run_once(model_args: list[str], prompt: str, options: list[str]) -> dict:
    result = subprocess.run(
        [*SPECGGUF, "run", *model_args, *options, "--json", prompt], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def _serve_once(client, model: str, prompt: str, *, k: int, max_tokens: int) -> dict:
    start = time.perf_counter()
    first, text, last = None, [], None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"speculative": {"k": k}},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            last = chunk
    end = time.perf_counter()
    if last is None or last.model_extra is None:
        raise SystemExit("the stream ended without a finish reason")
    timings = last.model_extra["timings"]
    generation = end - start - timings["prompt_ms"] / 1000
    return {
        "text": "".join(text),
        "tokens": timings["predicted_n"],
        "client_tps": timings["predicted_n"] / generation,
        "server_tps": timings["predicted_per_second"],
        "ttft": (first or end) - start,
        "wall": end - start,
    }


def wait_for_health(base_url: str, process: subprocess.Popen) -> None:
    """Until GET /health answers 200 (specgguf serve and llama-server both have it), or the process ends."""
    import httpx

    for _ in range(600):
        if process.poll() is not None:
            args = process.args
            program = os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
            raise SystemExit(f"{program} exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not come up")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", "--model")
    parser.add_argument("-md", "--model-draft")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", default="code,chat")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    from openai import OpenAI

    model_args = ["--pair", args.pair] if args.pair else []
    model_args += ["-m", args.model] if args.model else []
    model_args += ["-md", args.model_draft] if args.model_draft else []
    common = ["-t", str(args.threads), "-c", "2048"]
    run_options = [*common, "--temp", "0", "-k", str(args.k), "-n", str(args.max_tokens), "-q"]
    prompts = [PROMPTS[name] for name in args.prompts.split(",")]
    server = subprocess.Popen(
        [*SPECGGUF, "serve", *model_args, *common, "--port", str(args.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base_url = f"http://127.0.0.1:{args.port}"
    try:
        wait_for_health(base_url, server)
        client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        _serve_once(client, model, prompts[0], k=args.k, max_tokens=8)  # warm-up
        ratios, overheads, rows = [], [], []
        for repeat in range(args.repeats):
            for name, prompt in zip(args.prompts.split(","), prompts):
                ran = _run_once(model_args, prompt, run_options)
                served = _serve_once(client, model, prompt, k=args.k, max_tokens=args.max_tokens)
                same = "same text" if served["text"] == ran["text"] else "TEXT DIFFERS"
                ratios.append(served["client_tps"] / ran["tokens_per_second"])
                overheads.append(1 - served["client_tps"] / served["server_tps"])
                rows.append(
                    f"{repeat + 1:>6} {name:>8} {ran['n_tokens']:>6} {ran['tokens_per_second']:>9.2f}"
                    f" {served['client_tps']:>11.2f} {served['server_tps']:>11.2f} {ratios[-1]:>7.3f}"
                    f" {overheads[-1]:>8.1%} {served['ttft']:>7.2f}  {same}"
                )
        print(f"K={args.k}, greedy, {args.max_tokens} tokens, -t {args.threads}; tok/s of generation (prompt left out)")
        print(
            f"{'repeat':>6} {'prompt':>8} {'tokens':>6} {'run':>9} {'HTTP(cli)':>11} {'server':>11} {'ratio':>7}"
            f" {'overhead':>8} {'TTFT s':>7}"
        )
        print("\n".join(rows))
        print(
            f"HTTP/run tokens/s: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f});"
            f" HTTP overhead (client-timed vs the server's own timing of the same request): median"
            f" {statistics.median(overheads):.1%} (range {min(overheads):.1%} to {max(overheads):.1%})"
        )
        with ThreadPoolExecutor(4) as pool:
            start = time.perf_counter()
            results = list(
                pool.map(
                    lambda prompt: _serve_once(client, model, prompt, k=args.k, max_tokens=args.max_tokens),
                    [prompts[0]] * 4,
                )
            )
            wall = time.perf_counter() - start
        total_tps = sum(result["tokens"] for result in results) / wall
        mean_ttft = statistics.mean(result["ttft"] for result in results)
        same = "all the same text" if len({result["text"] for result in results}) == 1 else "TEXTS DIFFER"
        print(
            f"4 clients at once ({args.prompts.split(',')[0]} prompt): {total_tps:.2f} tok/s in total"
            f" (prompts included), mean time to first token {mean_ttft:.2f} s, {same}"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
