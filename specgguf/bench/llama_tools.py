"""llama.cpp's own programs, run as a reference: `llama-completion` (plain decoding) and
`llama-speculative-simple` (a draft model, fixed K), from a directory the user built
(docs/llama-cpp.md). Each run is one process with a time limit and stdin closed; it is
killed if it overruns or if we are interrupted. Speeds come from the programs' own
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

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core.sampling import SamplingSettings
from ..errors import SpecggufError, UsageError, terminal_safe

COMPLETION = "llama-completion"
SPECULATIVE = "llama-speculative-simple"
RUN_SECONDS = 900.0  # one run's limit: a 128-token answer takes well under a minute on 2 cores

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

    @classmethod
    def find(cls, directory: Path) -> LlamaTools:
        if not directory.is_dir():
            raise UsageError(
                f"--vs-llama-cpp {directory}: not a directory (build llama.cpp's tools as"
                " docs/llama-cpp.md says, e.g. `make llama-tools`)"
            )
        programs = []
        for name in (COMPLETION, SPECULATIVE):
            path = directory / name
            if not path.is_file():
                raise UsageError(f"--vs-llama-cpp {directory}: no {name} there (build it as docs/llama-cpp.md says)")
            if not os.access(path, os.X_OK):
                raise UsageError(f"--vs-llama-cpp {directory}: {name} is not executable")
            programs.append(path)
        return cls(directory, *programs)


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
    return parse_completion(_run(command, tools.directory))


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
    return parse_speculative(_run(command, tools.directory))


def parse_completion(log: str) -> ToolRun:
    """llama-completion's generation: its decode calls after the prompt, with sampling time."""
    prompt, evals, sampling = _PROMPT_EVAL.search(log), _EVAL.search(log), _SAMPLING.search(log)
    if not (prompt and evals and sampling):
        raise SpecggufError(f"{COMPLETION} printed no timing lines (llama_perf); its log ends: {_tail(log)}")
    eval_ms, sampling_ms = float(evals.group(1)), float(sampling.group(1))
    # The first token comes from the prompt's logits; each later one is one decode call (a "run").
    # Sampling time covers every token; our side's time includes sampling too.
    return ToolRun(n_prompt=int(prompt.group(2)), n_tokens=int(evals.group(2)), seconds=(eval_ms + sampling_ms) / 1000)


def parse_speculative(log: str) -> ToolRun:
    """llama-speculative-simple's "decoded N tokens in X seconds": all of its steps, prompt left out."""
    encoded, decoded = _ENCODED.search(log), _DECODED.search(log)
    if not (encoded and decoded):
        raise SpecggufError(f"{SPECULATIVE} printed no 'decoded N tokens' line; its log ends: {_tail(log)}")
    accept = _ACCEPT.search(log)
    return ToolRun(
        n_prompt=int(encoded.group(1)),
        n_tokens=int(decoded.group(1)),
        seconds=float(decoded.group(2)),
        n_drafted=int(accept.group(1)) if accept else None,
        n_accepted=int(accept.group(2)) if accept else None,
    )


def _run(command: list[str], directory: Path) -> str:
    """Run one program to the end (stdin closed) and return its log; never leave it running."""
    timeout = RUN_SECONDS
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_ARG_")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(directory), env.get("LD_LIBRARY_PATH")]))
    # The answer goes to stdout (not needed); the timing lines go to stderr, which the answer
    # cannot reach, so no generated text can pass for a timing line.
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        _, output = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SpecggufError(f"{Path(command[0]).name} ran past {timeout:g} s; stopped it") from None
    finally:  # a timeout, Ctrl-C or any error: the program does not outlive us
        if process.poll() is None:
            process.kill()
            process.wait()
    log = output.decode("utf-8", errors="replace")
    if process.returncode != 0:
        raise SpecggufError(
            f"{Path(command[0]).name} failed (exit status {process.returncode}); its log ends: {_tail(log)}"
        )
    return log


def _tail(log: str, lines: int = 4) -> str:
    """The last lines of a program's log, on one line, safe for a terminal."""
    return " | ".join(terminal_safe(line.strip()) for line in log.strip().splitlines()[-lines:])
