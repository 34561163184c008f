"""Several clients at once (`serve --parallel N`): FIM latency under a streaming chat, and total tok/s.

Starts `specgguf serve --parallel N` (a fresh server per configuration) and prints, side by side:
- /infill latency alone and while a chat answer of --chat-tokens streams (median of --fim-runs each;
  the aim: at most 1.5x alone);
- total tok/s of --clients chat questions asked one after another and all at once, each on a fresh
  server (a question asked before would come back from the caches), and the slowest request's tok/s
  (the aim: at once, at least one client's total, and 2x on a memory-bound pair).
Quiet machine only (the lead runs it); `--smoke` is a few seconds' check that it runs:

    .venv/bin/python scripts/serve_concurrency.py [--pair NAME | -m V -md D] [--parallel 4] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_server import live_server  # noqa: E402

INFILL = {
    "input_prefix": "def fibonacci(n):\n    ",
    "input_suffix": "\n\nprint(fibonacci(10))\n",
    "n_predict": 16,
    "temperature": 0,
}
QUESTIONS = [
    "Write a Python function that merges two sorted lists, with a docstring.",
    "Explain how a hash table handles collisions, with a short example.",
    "Write a bash script that counts the lines of every .py file in a folder.",
    "What is the difference between a process and a thread? Give an example.",
]


def fim_seconds(server) -> float:
    with server.http() as http:
        start = time.perf_counter()
        response = http.post("/infill", json=INFILL)
        response.raise_for_status()
        return time.perf_counter() - start


def chat_tokens(server, question: str, n: int, client=None) -> int:
    response = (client or server.client()).chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], max_tokens=n, temperature=0
    )
    return response.usage.completion_tokens


def fim_under_load(server, runs: int, chat_n: int) -> tuple[float, float]:
    """Median /infill seconds alone, then while a chat answer of chat_n tokens streams."""
    alone = statistics.median(fim_seconds(server) for _ in range(runs))
    loaded: list[float] = []
    while len(loaded) < runs:
        chat = threading.Thread(target=chat_tokens, args=(server, QUESTIONS[0], chat_n))
        chat.start()
        time.sleep(0.3)  # the chat is streaming
        while chat.is_alive() and len(loaded) < runs:
            loaded.append(fim_seconds(server))
        chat.join()
    return alone, statistics.median(loaded)


def throughput(server, clients: int, n: int, *, together: bool) -> tuple[float, float]:
    """Total tok/s of `clients` chat requests (different questions), all at once (`together`) or one
    after another, and the slowest request's tok/s. Each configuration runs on a fresh server: a
    question answered before would come back from the n-gram and prompt caches. The clients (the
    openai SDK imported, its HTTP client made) are ready before the clock starts: their start-up
    is not the server's time, and they are made a second before it starts: the server's threads
    follow the machine's load over the last half second (llama/threads.py), and a client's start-up
    (the SDK's imports: a core busy for most of a second) would cost it a thread for the prompts."""
    ready = [server.client() for _ in range(clients)]
    time.sleep(1.0)

    def one(index: int) -> tuple[int, float]:
        start = time.perf_counter()
        tokens = chat_tokens(server, QUESTIONS[index % len(QUESTIONS)], n, ready[index])
        return tokens, time.perf_counter() - start

    start = time.perf_counter()
    if together:
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, range(clients)))
    else:
        results = [one(index) for index in range(clients)]
    wall = time.perf_counter() - start
    return sum(tokens for tokens, _ in results) / wall, min(tokens / seconds for tokens, seconds in results)


@contextlib.contextmanager
def llama_server(program: str, model: str, draft: str | None, parallel: int):
    """llama.cpp's own server on the same files: `-np` slots, `-md` the draft, this machine's threads."""
    from live_server import LiveServer, free_port, wait_until_healthy

    port = free_port()
    command = [program, "-m", model, "-np", str(parallel), "-c", str(4096 * parallel), "--port", str(port)]
    command += ["-t", str(os.cpu_count() or 2)] + (["-md", draft] if draft else [])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = LiveServer(process, port, None)
    try:
        wait_until_healthy(server, 600)
        yield server
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", dest="model")
    parser.add_argument("-md", dest="draft")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--chat-tokens", type=int, default=256)
    parser.add_argument("--fim-runs", type=int, default=20)
    parser.add_argument("-n", type=int, default=128, help="tokens per chat answer in the throughput runs")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: does it run?")
    parser.add_argument("--serve-args", default="", help="more options for `specgguf serve` (e.g. '-k 0')")
    parser.add_argument(
        "--llama-server", help="also llama.cpp's llama-server (this program) on the same files and questions"
    )
    args = parser.parse_args()
    if args.smoke:
        args.chat_tokens, args.fim_runs, args.n = 32, 2, 16
    models = ["--pair", args.pair] if args.pair else ["-m", args.model] + (["-md", args.draft] if args.draft else [])
    models += args.serve_args.split()
    if args.fim_runs > 0:  # (0: throughput only)
        with live_server(*models, "--parallel", str(args.parallel), startup_timeout=600) as server:
            alone, loaded = fim_under_load(server, args.fim_runs, args.chat_tokens)
            print(f"/infill: {alone * 1000:.0f} ms alone, {loaded * 1000:.0f} ms under a chat ({loaded / alone:.2f}x)")
    speeds = {}
    for together in (False, True):
        with live_server(*models, "--parallel", str(args.parallel), startup_timeout=600) as server:
            speeds[together] = throughput(server, args.clients, args.n, together=together)
    (one_total, _), (many_total, slowest) = speeds[False], speeds[True]
    print(
        f"chat, {args.clients} questions: one after another {one_total:.1f} tok/s; all at once {many_total:.1f}"
        f" tok/s in total ({many_total / one_total:.2f}x), the slowest {slowest:.1f} tok/s"
    )
    if args.llama_server and args.model:
        for together in (False, True):
            with llama_server(args.llama_server, args.model, args.draft, args.parallel) as server:
                speeds[together] = throughput(server, args.clients, args.n, together=together)
        (one_total, _), (many_total, slowest) = speeds[False], speeds[True]
        print(
            f"llama-server -np {args.parallel}{' -md' if args.draft else ''}, the same questions: one after another"
            f" {one_total:.1f} tok/s; all at once {many_total:.1f} tok/s in total ({many_total / one_total:.2f}x),"
            f" the slowest {slowest:.1f} tok/s"
        )


if __name__ == "__main__":
    main()
