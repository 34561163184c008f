"""What a comparison was measured on: the CPU, whether it has AVX-512 VNNI, and the verifier's
verify curve by llama.cpp's own `llama-bench -p 1,2,4,8` (figures from different CPUs never compare)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path

from ..errors import SpecggufError
from ..llama import huge_pages
from .llama_tools import LlamaTools, run_program

LLAMA_BENCH = "llama-bench"
BATCH_ROWS = (1, 2, 4, 8)


def cpu() -> dict:
    """The CPU's model name and whether its flags include avx512_vnni (Linux's /proc/cpuinfo: the first
    processor's lines)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    return {"cpu": name, "avx512_vnni": "avx512_vnni" in fields.get("flags", "").split(), "cores": os.cpu_count()}


def llama_bench(tools: LlamaTools, model: Path, n_threads: int) -> dict[int, float] | None:
    """tok/s of a prompt pass of 1, 2, 4 and 8 rows (None: no llama-bench beside the other programs)."""
    program = tools.directory / LLAMA_BENCH
    if not program.is_file():
        return None
    rows = ",".join(map(str, BATCH_ROWS))
    command = [str(program), "-m", str(model), "-p", rows, "-n", "0", "-t", str(n_threads), "-r", "3", "-o", "json"]
    log = run_program(command, tools.directory, seconds=600.0, output=True, same_pages=tools.same_pages)
    try:
        entries = json.loads(log)
        return {int(entry["n_prompt"]): float(entry["avg_ts"]) for entry in entries}
    except (ValueError, KeyError, TypeError) as error:
        raise SpecggufError(f"{LLAMA_BENCH} printed no JSON this version reads: {error}") from None


def pages(*, llama_cpp_same: bool, ours: Mapping[str, str] | None = None) -> dict:
    """Whether ours (this process, or one started with the environment `ours`) and llama.cpp's programs
    have huge pages (llama/huge_pages.py): a 10-20% difference."""
    return {"huge_pages": huge_pages.describe(ours), "llama_cpp_same_pages": llama_cpp_same}


def machine_report(tools: LlamaTools, verifiers: list[tuple[str, Path]], n_threads: int) -> dict:
    return {
        **cpu(),
        **pages(llama_cpp_same=tools.same_pages),
        "threads": n_threads,
        "llama_bench": {label: llama_bench(tools, path, n_threads) for label, path in verifiers},
    }


def machine_lines(report: dict) -> str:
    """The report's machine as text: the CPU, then each verifier's pass cost by rows, relative to one row."""
    lines = [
        f"CPU: {report['cpu']} ({report['cores']} cores, -t {report['threads']}),"
        f" avx512_vnni: {'yes' if report['avx512_vnni'] else 'no'}"
    ]
    if "huge_pages" in report:
        theirs = (
            "the same" if report["llama_cpp_same_pages"] else "as users run them (--llama-cpp-huge-pages: the same)"
        )
        lines.append(f"ours: {report['huge_pages']}; llama.cpp's programs: {theirs}")
    for label, speeds in report["llama_bench"].items():
        if not speeds:
            lines.append(f"{label}: no {LLAMA_BENCH} beside llama.cpp's programs (make llama-tools builds it)")
            continue
        speeds = {int(rows): float(speed) for rows, speed in speeds.items()}  # (keys are text in --json)
        one = 1.0 / speeds[1] if 1 in speeds else None
        parts = [
            f"{rows} rows {rows / speed * 1000:.1f} ms" + (f" ({rows / speed / one:.2f}× one)" if one else "")
            for rows, speed in sorted(speeds.items())
        ]
        lines.append(f"{label} llama-bench -p {','.join(map(str, BATCH_ROWS))}: " + ", ".join(parts))
    return "\n".join(lines)
