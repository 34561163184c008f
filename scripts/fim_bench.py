"""Fill in the middle on a code file: the server's default drafting vs plain decoding (k=0).

Starts `specgguf serve` once, cuts a code file at several cursor positions (prefix before, suffix
after, llama.vscode-style /infill requests with greedy sampling), asks each position with the
default drafting and with {"speculative": {"k": 0}}, interleaved, and prints the median tokens/s
(the server's own `timings.predicted_per_second`) side by side with their ratio. Quiet machine only:

    .venv/bin/python scripts/fim_bench.py [--pair NAME | -m V -md D] [--file F] [--positions 8] [-n 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from live_server import free_port  # noqa: E402

DEFAULT_FILE = Path(__file__).resolve().parent.parent / "specgguf" / "serve" / "text.py"


def cursor_positions(text: str, count: int) -> list[int]:
    """Line starts spread through the file's middle (where an editor's cursor would sit)."""
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1 : i + 2].strip()]
    starts = starts[len(starts) // 5 : -max(1, len(starts) // 5)] or starts
    step = max(1, len(starts) // count)
    return starts[::step][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("-m", dest="model")
    parser.add_argument("-md", dest="draft")
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("--serve-arg", action="append", default=[], help="more `specgguf serve` options")
    args = parser.parse_args()
    models = ["--pair", args.pair] if args.pair else []
    models += ["-m", args.model] if args.model else []
    models += ["-md", args.draft] if args.draft else []
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "specgguf", "serve", *models, "--port", str(port), "-c", str(args.ctx_size),
         *args.serve_arg],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base, server)
        text = args.file.read_text()
        rates: dict[str, list[float]] = {"default": [], "k=0": []}
        with httpx.Client(base_url=base, timeout=900) as http:
            for position in cursor_positions(text, args.positions):
                body = {"input_prefix": text[:position], "input_suffix": text[position:], "n_predict": args.n,
                        "temperature": 0, "n_indent": 0}  # fmt: skip
                for _ in range(args.repeats):
                    for name, extra in (("default", {}), ("k=0", {"speculative": {"k": 0}})):
                        answer = http.post("/infill", json={**body, **extra})
                        answer.raise_for_status()
                        rates[name].append(answer.json()["timings"]["predicted_per_second"])
        default, plain = statistics.median(rates["default"]), statistics.median(rates["k=0"])
        print(f"FIM on {args.file.name}, {len(rates['k=0'])} requests each, -n {args.n}, greedy")
        print(f"{'drafting':>10} {'tokens/s':>10}")
        print(f"{'default':>10} {default:>10.1f}")
        print(f"{'k=0':>10} {plain:>10.1f}")
        print(f"{'ratio':>10} {default / plain if plain else float('nan'):>10.2f}x")
    finally:
        server.terminate()
        server.wait(timeout=60)


def _wait(base: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("the server exited")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not come up")


if __name__ == "__main__":
    main()
