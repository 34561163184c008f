"""Which of the package's files a request runs through, measured on a live `specgguf serve`.

farm-studio's `walk` follows one parameter through the code as written; this follows the program as it
runs. The server is started under a profile hook (every thread's Python calls); the hook records nothing
until the server is up and the request is about to be sent, then records each call into a file of the
package, and the caller's file (the nearest frame of the package up the same thread's stack). Then the
requests are sent, `--clients` at once (after as many unrecorded ones: every lane's lazy set-up done),
and the record is written. Printed: the files by wing, the calls
between wings, and the calls that go *up* the layers (a lower wing calling a higher one at run time: a
callback, which the import contracts cannot see).

    python scripts/request_walk.py --parallel 2 --clients 2          # tiny models made here
    PYTHONPATH=/tmp/before python scripts/request_walk.py ...        # another checkout's package

The tiny GGUFs come from tests/tiny_gguf.py; no model is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# Layers, highest first (pyproject's import contract, with serve/ and llama/ as wings of their own).
LAYERS = [
    ("cli",),
    ("serve", "bench"),
    ("prepare",),
    ("drafts", "kchoice"),
    ("tuning", "conversation", "grammar"),
    ("core", "llama", "files", "grammar_check"),
    ("errors",),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# Run inside the server's process before the command line: the hook and the two signals.
BOOTSTRAP = r"""
import json, os, signal, sys, threading
record = {"on": False, "edges": {}}
MARK = os.sep + "specgguf" + os.sep

def package_file(code):
    name = code.co_filename
    qualname = getattr(code, "co_qualname", code.co_name)  # (Python 3.11 on)
    return name + ":" + qualname if MARK in name and "site-packages" not in name else None

def hook(frame, event, arg):
    if event != "call" or not record["on"]:
        return
    callee = package_file(frame.f_code)
    if callee is None:
        return
    caller, back = None, frame.f_back
    while back is not None and caller is None:
        caller = package_file(back.f_code)
        back = back.f_back
    key = (caller or "-") + "\t" + callee
    record["edges"][key] = record["edges"].get(key, 0) + 1

def start(signum, frame):
    record["on"] = True

def stop(signum, frame):
    record["on"] = False
    with open(os.environ["REQUEST_WALK_OUT"], "w") as out:
        json.dump(record["edges"], out)

signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
threading.setprofile(hook)
sys.setprofile(hook)
sys.argv = ["specgguf"] + sys.argv[1:]
from specgguf.__main__ import main
sys.exit(main())
"""


def relative(where: str) -> str:
    """A function's file of the package as `wing/module.py` (`-` for a call from outside it)."""
    if where == "-":
        return where
    parts = Path(where.rsplit(":", 1)[0]).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("specgguf") + 1 :])


def wing(name: str) -> str:
    return name.split("/")[0].removesuffix(".py")


def serve_command(args: argparse.Namespace, verifier: Path, draft: Path, port: int) -> list[str]:
    options = ["-m", str(verifier), "-md", str(draft), "-c", "512", "-t", "1", "-n", str(args.tokens)]
    return [sys.executable, "-c", BOOTSTRAP, "serve", *options, "--parallel", str(args.parallel), "--port", str(port)]


def ask(base_url: str, index: int, tokens: int) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Say something, client {index}."}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    response = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()


def send_at_once(base_url: str, clients: int, tokens: int, *, first: int = 0) -> None:
    threads = [threading.Thread(target=ask, args=(base_url, first + i, tokens)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(args: argparse.Namespace) -> dict[str, int]:
    from live_server import LiveServer, free_port, wait_until_healthy
    from tiny_gguf import write_tiny_llama

    folder = Path(tempfile.mkdtemp(prefix="request-walk-"))
    verifier = write_tiny_llama(folder / "verifier.gguf", base_seed=7)
    draft = write_tiny_llama(folder / "draft.gguf", base_seed=7, seed=1, noise=0.05)
    port, out = free_port(), folder / "edges.json"
    env = {**os.environ, "REQUEST_WALK_OUT": str(out), "XDG_CONFIG_HOME": str(folder), "XDG_CACHE_HOME": str(folder)}
    command = serve_command(args, verifier, draft, port)  # run from the temporary folder: `-c` puts the cwd first
    process = subprocess.Popen(command, cwd=folder, env=env, stderr=subprocess.PIPE, text=True)

    live = LiveServer(process, port, None)
    try:
        wait_until_healthy(live, 120)
        # First requests, as many at once as will be measured: a lane's lazy set-up (its K policy, built
        # on its first request) is not the request's walk.
        send_at_once(live.base_url, args.clients, args.tokens, first=-args.clients)
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        send_at_once(live.base_url, args.clients, args.tokens)
        process.send_signal(signal.SIGUSR2)
        for _ in range(100):
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    return dict(json.loads(out.read_text()))


def report(edges: dict[str, int]) -> dict:
    pairs: Counter[tuple[str, str]] = Counter()
    for key, count in edges.items():
        caller, callee = key.split("\t")
        pairs[(relative(caller), relative(callee))] += count
    files = sorted({callee for _, callee in pairs})
    between: Counter[tuple[str, str]] = Counter()
    for (a, b), n in pairs.items():
        if a != "-" and wing(a) != wing(b):
            between[(wing(a), wing(b))] += n
    up = sorted(
        (a, b, n)
        for (a, b), n in pairs.items()
        if a != "-" and wing(a) in RANK and wing(b) in RANK and RANK[wing(b)] < RANK[wing(a)]
    )
    by_wing = Counter(wing(name) for name in files)
    return {"files": files, "by_wing": dict(by_wing), "between": between, "up": up}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parallel", type=int, default=2, help="the server's --parallel")
    parser.add_argument("--clients", type=int, default=2, help="requests sent at once")
    parser.add_argument("--tokens", type=int, default=24, help="max_tokens of each request")
    parser.add_argument("--json", type=Path, help="also write the record here")
    args = parser.parse_args()
    try:
        found = report(measure(args))
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError, httpx.HTTPError) as error:
        parser.exit(1, f"specgguf: error: {error}\n")  # the server did not come up, or answered no record
    print(f"{len(found['files'])} files in {len(found['by_wing'])} wings ran for the request(s):")
    for name, count in sorted(found["by_wing"].items(), key=lambda item: -item[1]):
        print(f"  {name:14} {count:3}  " + " ".join(f for f in found["files"] if wing(f) == name))
    print("calls between wings (caller -> callee: calls):")
    for (a, b), n in sorted(found["between"].items()):
        print(f"  {a} -> {b}: {n}")
    print(f"calls up the layers at run time: {len(found['up'])}")
    for a, b, n in found["up"]:
        print(f"  {a} -> {b}: {n}")
    if args.json:
        found["between"] = [[a, b, n] for (a, b), n in found["between"].items()]
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
