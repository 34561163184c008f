"""The servers a trace is replayed against (bench/trace_replay.py): `specgguf serve` with its default
settings and llama.cpp's `llama-server` (plain, with a draft model at each K, with its n-gram
speculation types), each a process on 127.0.0.1 and a free port, its log in a temporary file, all
stopped whatever happens."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..errors import SpecggufError, terminal_safe
from ..llama.huge_pages import restart_with_huge_pages
from .llama_tools import llama_environment

STARTUP_SECONDS = 300.0  # loading two models on a busy 2-core machine
PLAIN = "llama-server plain"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: tuple[str, ...]  # without --port, which is added when it starts
    environment: tuple[tuple[str, str], ...] = ()  # set for it (LLAMA_SERVER_SLOTS_DEBUG, say)
    counts_eog: bool = False  # its predicted_n counts the end-of-generation token (llama-server's does)


@dataclass(frozen=True)
class Running:
    name: str
    base_url: str
    process: subprocess.Popen
    log: Path
    counts_eog: bool = False  # as its ServerSpec's


@dataclass(frozen=True)
class PairSettings:
    verifier: Path
    draft: Path
    n_threads: int
    n_ctx: int


def specgguf_spec(pair: PairSettings, name: str = "specgguf serve") -> ServerSpec:
    """`specgguf serve` on the pair, its defaults otherwise (the same threads and context as llama-server)."""
    return ServerSpec(
        name,
        (sys.executable, "-m", "specgguf", "serve", "-m", str(pair.verifier), "-md", str(pair.draft))
        + ("-t", str(pair.n_threads), "-c", str(pair.n_ctx)),
    )


def from_checkout(spec: ServerSpec, checkout: Path, name: str) -> ServerSpec:
    """`spec` (a `specgguf serve`) run from another checkout's package (a git worktree): an A/B of a change."""
    # PYTHONSAFEPATH: `python -m specgguf` does not put the working directory (this checkout) first
    environment = (("PYTHONPATH", str(checkout.resolve())), ("PYTHONSAFEPATH", "1"))
    return dataclasses.replace(spec, name=name, environment=spec.environment + environment)


def llama_server_specs(
    program: Path, pair: PairSettings, *, draft_ks: list[int], ngram_types: list[str]
) -> list[ServerSpec]:
    """llama-server plain (the reference), with the draft model at each K, and with each n-gram type.
    One slot each (-np 1: one client, as a user's editor or agent is), --jinja for the tool traces;
    cache_prompt is on in every request (bench/trace_replay.py)."""
    threads = str(pair.n_threads)
    common: tuple[str, ...] = (str(program), "-m", str(pair.verifier), "-t", threads, "-c", str(pair.n_ctx), "-np", "1")
    common += ("--no-webui", "--jinja")
    specs = [ServerSpec(PLAIN, common, counts_eog=True)]
    for k in draft_ks:
        draft = ("-md", str(pair.draft), "-td", threads, "--spec-type", "draft-simple")
        specs.append(
            ServerSpec(
                f"llama-server -md K={k}",
                common + draft + ("--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"),
                counts_eog=True,
            )
        )
    for kind in ngram_types:
        specs.append(ServerSpec(f"llama-server {kind}", common + ("--spec-type", kind), counts_eog=True))
    return specs


def spec_types(program: Path) -> list[str]:
    """The speculation types this llama-server takes (`--spec-type a,b,...` in its --help)."""
    try:
        text = subprocess.run(
            [str(program), "--help"], capture_output=True, text=True, timeout=60, env=_environment(program)
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SpecggufError(f"cannot run {program} --help: {error}") from None
    for line in text.splitlines():
        if line.startswith("--spec-type "):
            return line.split()[1].split(",")
    return []


def _environment(program: Path) -> dict[str, str]:
    """llama.cpp's as users run it (`specgguf serve` gives itself huge pages of its own), without our
    server's API key."""
    env = llama_environment(program.parent)
    env.pop("SPECGGUF_API_KEY", None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running(specs: list[ServerSpec], *, startup_seconds: float = STARTUP_SECONDS) -> Iterator[list[Running]]:
    """Start every server (one after another, each healthy before the next loads), yield them, stop them all."""
    started: list[Running] = []
    with tempfile.TemporaryDirectory(prefix="specgguf-traces-") as folder:
        try:
            for index, spec in enumerate(specs):
                port = _free_port()
                log = Path(folder) / f"server-{index}.log"
                with log.open("wb") as out:
                    try:
                        process = subprocess.Popen(
                            [*spec.command, "--port", str(port), "--host", "127.0.0.1"],
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            env=_environment(Path(spec.command[0])) | dict(spec.environment),
                            start_new_session=True,
                        )
                    except OSError as error:  # no such program, or not one that runs
                        raise SpecggufError(f"cannot start {spec.name} ({spec.command[0]}): {error.strerror}") from None
                server = Running(spec.name, f"http://127.0.0.1:{port}", process, log, spec.counts_eog)
                started.append(server)
                _wait_healthy(server, startup_seconds)
            yield started
        finally:
            for server in started:
                _stop(server.process)


def _wait_healthy(server: Running, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if server.process.poll() is not None:
            raise SpecggufError(f"{server.name} exited ({server.process.returncode}); its log ends: {log_tail(server)}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SpecggufError(f"{server.name} was not healthy within {seconds:g} s; its log ends: {log_tail(server)}")
        time.sleep(0.2)


def log_tail(server: Running, lines: int = 4) -> str:
    try:
        text = server.log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(terminal_safe(line.strip()[-300:]) for line in text.strip().splitlines()[-lines:])


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_script(main: Callable[[], None]) -> None:
    """A benchmark script's entry (scripts/bench_traces.py, ttft_overhead.py, the in-process timings):
    first started again with huge pages where `specgguf` itself would be (llama/huge_pages.py: a pass
    10-20% faster), so what it times in-process is timed as the program runs (the servers it starts get
    their own: `llama_environment`); `timeout` or `kill` unwinds as Ctrl-C does, so that no server
    outlives the run (`running` stops them all); an error is one line."""
    restart_with_huge_pages()  # returns where that changes nothing (set already, or no such pages here)
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(143))
    try:
        main()
    except SpecggufError as error:
        sys.exit(f"specgguf: error: {error}")
    except KeyboardInterrupt:
        sys.exit(130)
