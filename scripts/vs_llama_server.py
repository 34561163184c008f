"""`specgguf serve` against llama.cpp's own `llama-server -md`, side by side, through the same HTTP API.

Starts three servers on 127.0.0.1 (they idle while another answers): llama-server without a
draft (plain), llama-server with the draft (`--spec-type draft-simple --spec-draft-n-max K`),
and `specgguf serve` with the same pair. Then, for each repeat and prompt, sends the same
greedy chat request to each setting in turn (specgguf: `-k 0`, `-k K` and its default, chosen
per request with the `speculative` object) and reports each server's own generation speed
(`timings.predicted_per_second`, prompt left out). Build llama-server as docs/llama-cpp.md says.

    .venv/bin/python scripts/vs_llama_server.py --llama-server /path/to/llama-server \\
        -m VERIFIER.gguf -md DRAFT.gguf -k 4 -n 128 --repeats 3
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys

from bench_serve import wait_for_health  # scripts/bench_serve.py (this folder is on sys.path)

from specgguf.bench.measure import PROMPTS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ask(url: str, prompt: str, n: int, extra: dict | None = None) -> tuple[float, int, str]:
    import httpx

    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0, **(extra or {})}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=900).json()
    timings = answer["timings"]
    return timings["predicted_per_second"], timings["predicted_n"], answer["choices"][0]["message"]["content"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("-m", required=True)
    parser.add_argument("-md", required=True)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-t", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", default="code,chat,edit")
    args = parser.parse_args()
    common = ["-m", args.m, "-t", str(args.t), "-c", "2048"]
    servers = {
        "llama plain": [args.llama_server, *common, "-np", "1", "--no-webui"],
        f"llama K={args.k}": [
            args.llama_server,
            *common,
            "-np",
            "1",
            "--no-webui",
            "-md",
            args.md,
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            str(args.k),
            "--spec-draft-n-min",
            "0",
            "-td",
            str(args.t),
        ],
        "specgguf": [sys.executable, "-m", "specgguf", "serve", *common, "-md", args.md],
    }
    urls, processes = {}, []
    try:
        for name, command in servers.items():
            port = free_port()
            process = subprocess.Popen(
                [*command, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            processes.append(process)
            urls[name] = f"http://127.0.0.1:{port}"
            wait_for_health(urls[name], process)
        settings = {
            "llama-server plain": (urls["llama plain"], None),
            f"llama-server -md K={args.k}": (urls[f"llama K={args.k}"], None),
            "specgguf serve -k 0": (urls["specgguf"], {"speculative": {"k": 0}}),
            f"specgguf serve -k {args.k}": (urls["specgguf"], {"speculative": {"k": args.k}}),
            "specgguf serve default": (urls["specgguf"], None),
        }
        kinds = args.prompts.split(",")
        for url, extra in settings.values():  # warm-up: page the weights in
            ask(url, PROMPTS[kinds[0]], 8, extra)
        speeds: dict[tuple[str, str], list[float]] = {}
        texts: dict[str, set[str]] = {}
        for repeat in range(args.repeats):
            for kind in kinds:
                for name, (url, extra) in settings.items():
                    speed, n, text = ask(url, PROMPTS[kind], args.n, extra)
                    speeds.setdefault((name, kind), []).append(speed)
                    texts.setdefault(kind, set()).add(text)
                    print(f"repeat {repeat + 1} {kind:<6} {name:<26} {speed:6.2f} tok/s ({n} tokens)", file=sys.stderr)
        print(
            f"\ngreedy, {args.n} tokens, -t {args.t}; median tok/s of {args.repeats} interleaved repeats"
            " (each server's own timings, prompt left out)"
        )
        print("| prompt | " + " | ".join(settings) + " | specgguf default / best llama-server |")
        print("|---|" + "---|" * (len(settings) + 1))
        for kind in kinds:
            medians = {name: statistics.median(speeds[(name, kind)]) for name in settings}
            best_llama = max(medians["llama-server plain"], medians[f"llama-server -md K={args.k}"])
            print(
                f"| {kind} | "
                + " | ".join(f"{value:.2f}" for value in medians.values())
                + f" | {medians['specgguf serve default'] / best_llama:.2f}× |"
            )
        for kind, variants in texts.items():
            print(
                f"{kind}: {len(variants)} distinct text(s) across the settings (greedy; batch sizes can"
                " shift llama.cpp's logits slightly)"
            )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)


if __name__ == "__main__":
    main()
