"""llama.cpp's own programs, run as a reference: `llama-completion` (plain decoding) and
`llama-speculative-simple` (a draft model, fixed K), from a directory the user built
(docs/llama-cpp.md). Each run is one process group with a time limit scaled to -n and stdin
closed; the whole group is killed if it overruns, when it ends (a background child of its own
that keeps its log open is not waited for), or if we are interrupted. Speeds come from the programs' own
timing lines, which this version of llama.cpp prints as:

    llama-completion (common_perf_print, llama_perf):
      common_perf_print:    sampling time =      12.34 ms
      common_perf_print: prompt eval time =     123.45 ms /    30 tokens (...)
      common_perf_print:        eval time =    1234.56 ms /   127 runs   (...)
    llama-speculative-simple:
      encoded   30 tokens in    0.123 seconds, speed:  243.902 t/s
      decoded  129 tokens in    9.876 seconds, speed:   13.062 t/s
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.sampling import SamplingSettings
from ..errors import SpecggufError, UsageError, terminal_safe
from ..llama import huge_pages

COMPLETION = "llama-completion"
SPECULATIVE = "llama-speculative-simple"
RUN_SECONDS = 120.0  # one run's limit, loading the models: plus SECONDS_PER_TOKEN for each of -n
SECONDS_PER_TOKEN = 2.0  # a 128-token answer takes well under a minute on 2 cores: 376 s is ample
LOG_CHARS = 600  # what an error shows of a program's log, at most

_SAMPLING = re.compile(r"sampling time =\s*([\d.]+) ms")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_drafted = (\d+)\s.*?n_accept\s+= (\d+)", re.DOTALL)


@dataclass(frozen=True)
class LlamaTools:
    """The two llama.cpp programs, found and checked in one directory."""

    directory: Path
    completion: Path
    speculative: Path
    same_pages: bool = False  # run them with this program's huge pages (llama/huge_pages.py), not as users do

    @classmethod
    def find(cls, directory: Path, *, option: str = "--vs-llama-cpp", same_pages: bool = False) -> LlamaTools:
        """llama.cpp's programs in `directory`, which the command line gave as `option` (its errors name it)."""
        if not directory.is_dir():
            raise UsageError(
                f"{option} {directory}: not a directory (build llama.cpp's tools as"
                " docs/llama-cpp.md says, e.g. `make llama-tools`)"
            )
        programs = []
        for name in (COMPLETION, SPECULATIVE):
            path = directory / name
            if not path.is_file():
                raise UsageError(f"{option} {directory}: no {name} there (build it as docs/llama-cpp.md says)")
            if not os.access(path, os.X_OK):
                raise UsageError(f"{option} {directory}: {name} is not executable")
            programs.append(path)
        completion, speculative = programs
        return cls(directory, completion, speculative, same_pages=same_pages)


@dataclass(frozen=True)
class ToolSettings:
    """What both programs are given, the same as our side gets."""

    n_threads: int
    n_ctx: int
    max_tokens: int
    sampling: SamplingSettings
    seed: int

    def arguments(self) -> list[str]:
        threads = str(self.n_threads)
        sampling = self.sampling
        return [
            "-t",
            threads,
            "-tb",
            threads,
            "-c",
            str(self.n_ctx),
            "-n",
            str(self.max_tokens),
            "--temp",
            f"{sampling.temperature:g}",
            "--top-k",
            str(sampling.top_k),
            "--top-p",
            f"{sampling.top_p:g}",
            "--min-p",
            f"{sampling.min_p:g}",
            # Our sampler chain (sampling.py), and nothing else (no penalties, DRY, XTC...).
            "--samplers",
            "top_k;top_p;min_p;temperature",
            "--seed",
            str(self.seed),
            "--no-escape",
            "--perf",
        ]


@dataclass(frozen=True)
class ToolRun:
    """One llama.cpp run, as its own timing lines tell it."""

    n_prompt: int  # prompt tokens it read: must equal ours for a fair comparison
    n_tokens: int  # generated tokens its speed counts
    seconds: float  # their generation time, the prompt left out
    n_drafted: int | None = None
    n_accepted: int | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0


def run_plain(tools: LlamaTools, *, model: Path, prompt: str, settings: ToolSettings) -> ToolRun:
    """llama-completion on the prompt text as given (no chat template of its own: -no-cnv)."""
    command = [
        str(tools.completion),
        "-m",
        str(model),
        "-p",
        prompt,
        "-no-cnv",
        "--no-display-prompt",
        *settings.arguments(),
    ]
    return parse_completion(_run(command, tools, max_tokens=settings.max_tokens))


def run_speculative(
    tools: LlamaTools, *, model: Path, draft: Path, k: int, prompt: str, settings: ToolSettings
) -> ToolRun:
    """llama-speculative-simple with a draft model drafting K tokens a step (draft p-min 0: always K)."""
    threads = str(settings.n_threads)
    command = [
        str(tools.speculative),
        "-m",
        str(model),
        "-md",
        str(draft),
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        str(k),
        "--spec-draft-p-min",
        "0",
        "-td",
        threads,
        "-tbd",
        threads,
        "-p",
        prompt,
        *settings.arguments(),
    ]
    return parse_speculative(_run(command, tools, max_tokens=settings.max_tokens))


def _number(text: str, program: str, what: str, log: str, *, zero: bool = False) -> float:
    """A number from a timing line, finite and positive (or zero, if `zero`), or one error naming the program."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or value == 0 and not zero:
        raise SpecggufError(
            f"{program} reported {what} as {text[:40]!r}: no speed can be given; its log ends: {_tail(log)}"
        )
    return value


def parse_completion(log: str) -> ToolRun:
    """llama-completion's generation: its decode calls after the prompt, with sampling time."""
    prompt, evals, sampling = _PROMPT_EVAL.search(log), _EVAL.search(log), _SAMPLING.search(log)
    if not (prompt and evals and sampling):
        raise SpecggufError(f"{COMPLETION} printed no timing lines (llama_perf); its log ends: {_tail(log)}")
    eval_ms = _number(evals.group(1), COMPLETION, "its eval time", log)
    sampling_ms = _number(sampling.group(1), COMPLETION, "its sampling time", log, zero=True)
    _number(evals.group(2), COMPLETION, "its number of runs", log)
    # The first token comes from the prompt's logits; each later one is one decode call (a "run").
    # Sampling time covers every token; our side's time includes sampling too.
    return ToolRun(n_prompt=int(prompt.group(2)), n_tokens=int(evals.group(2)), seconds=(eval_ms + sampling_ms) / 1000)


def parse_speculative(log: str) -> ToolRun:
    """llama-speculative-simple's "decoded N tokens in X seconds": all of its steps, prompt left out."""
    encoded, decoded = _ENCODED.search(log), _DECODED.search(log)
    if not (encoded and decoded):
        raise SpecggufError(f"{SPECULATIVE} printed no 'decoded N tokens' line; its log ends: {_tail(log)}")
    seconds = _number(decoded.group(2), SPECULATIVE, "its decoding time", log)
    _number(decoded.group(1), SPECULATIVE, "its number of decoded tokens", log)
    accept = _ACCEPT.search(log)
    return ToolRun(
        n_prompt=int(encoded.group(1)),
        n_tokens=int(decoded.group(1)),
        seconds=seconds,
        n_drafted=int(accept.group(1)) if accept else None,
        n_accepted=int(accept.group(2)) if accept else None,
    )


def run_limit(max_tokens: int) -> float:
    """One run's time limit: the models' loading, then time for each token asked for."""
    return RUN_SECONDS + SECONDS_PER_TOKEN * max_tokens


def _run(command: list[str], tools: LlamaTools, *, max_tokens: int) -> str:
    """Run one program to the end (stdin closed) and return its log; nothing of it is left running."""
    return run_program(command, tools.directory, seconds=run_limit(max_tokens), same_pages=tools.same_pages)


def llama_environment(directory: Path, *, same_pages: bool = False) -> dict[str, str]:
    """The environment a program of llama.cpp's in `directory` runs in: ours without `LLAMA_ARG_*` (its
    flags' environment twins), its directory first on LD_LIBRARY_PATH, and its memory pages as users have
    them, or with `same_pages` as this program has them (huge_pages.for_llama_cpp)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_ARG_")}
    env = huge_pages.for_llama_cpp(env, same_as_ours=same_pages)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(directory), env.get("LD_LIBRARY_PATH")]))
    return env


def run_program(
    command: list[str], directory: Path, *, seconds: float, output: bool = False, same_pages: bool = False
) -> str:
    """Run a program of `directory` to the end within `seconds` (stdin closed, its own process group,
    killed whole whatever happens) and return its log, or with `output` what it printed on stdout.
    Its memory pages as users have them, or with `same_pages` as this program has them."""
    env = llama_environment(directory, same_pages=same_pages)
    # The answer goes to stdout (not needed); the timing lines go to stderr, which the answer
    # cannot reach, so no generated text can pass for a timing line.
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if output else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: killed whole below
    )
    try:
        printed, logged = _collect(process, seconds, Path(command[0]).name)
    finally:  # a timeout, Ctrl-C or any error: neither the program nor a child of its outlives us
        _kill_group(process)
    log = logged.decode("utf-8", errors="replace")
    if process.returncode != 0:
        raise SpecggufError(
            f"{Path(command[0]).name} failed (exit status {process.returncode}); its log ends: {_tail(log)}"
        )
    return (printed or b"").decode("utf-8", errors="replace") if output else log


def _collect(process: subprocess.Popen, timeout: float, name: str) -> tuple[bytes | None, bytes]:
    """Its stdout and stderr until it ends (not until every child of its closes the pipes), within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return process.communicate(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
        except subprocess.TimeoutExpired:
            if process.poll() is not None:  # it ended; something it started holds the log open
                _kill_group(process)
                return process.communicate()
            if time.monotonic() >= deadline:
                raise SpecggufError(f"{name} ran past {timeout:g} s; stopped it") from None


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait()


def _tail(log: str, lines: int = 4) -> str:
    """The last lines of a program's log, on one line, safe for a terminal, at most LOG_CHARS long."""
    parts = [terminal_safe(line.strip()[-LOG_CHARS:]) for line in log.strip().splitlines()[-lines:]]
    text = " | ".join(parts)
    return text if len(text) <= LOG_CHARS else "..." + text[-LOG_CHARS:]
