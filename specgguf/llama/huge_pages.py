"""Huge pages for llama.cpp's buffers: the weights it repacks on the CPU, the KV cache, the rest.

On Linux a process's memory is mapped in 4 KiB pages unless it asks for 2 MiB ones. A decode step
reads every weight once, ~1 GB for the 1.5B Q4_K_M verifier, and with 4 KiB pages that is a quarter
of a million page-table entries a token through a TLB of a few thousand; with 2 MiB pages, 500. Where
the kernel's transparent huge pages are set to `madvise` (Ubuntu's default, among others), only memory
that asked for them gets them, and llama.cpp does not ask. glibc asks for every block it maps itself
when its tunable `glibc.malloc.hugetlb=1` is set (glibc 2.35 and
later), which llama.cpp's buffers are; a tunable is read when a process starts, so the program
starts itself again with it (`restart_with_huge_pages`, from `__main__` before anything is loaded).
Measured on a 2-core Xeon VM (THP `madvise`): llama-bench's token 68.5 ms without, 57.0 ms with
(docs/benchmarks.md). The weights llama.cpp leaves in the file's memory map stay in 4 KiB page-cache
pages, so a model read wholly on this CPU is read into memory instead (`read_into_memory`).

Off with SPECGGUF_HUGE_PAGES=0 (neither the tunable nor reading a model into memory), or a
GLIBC_TUNABLES that sets glibc.malloc.hugetlb itself. Where
THP is `always`, every large block has huge pages already; where `never`, none can. The programs of
llama.cpp that `bench` runs beside ours get the environment users run them with (`for_llama_cpp`).
Imports nothing slow (not even pathlib): `__main__` calls it before the command line's imports.
"""

from __future__ import annotations

import os
import sys
from _collections_abc import Mapping  # collections.abc, loaded with os: importing that takes 1.6 ms

TUNABLE = "glibc.malloc.hugetlb=1"
SWITCH = "SPECGGUF_HUGE_PAGES"  # "0": off; "added": this program added TUNABLE when it started
ADDED = "added"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)  # the first with glibc.malloc.hugetlb
LOAD_MODE = "LLAMA_ARG_LOAD_MODE"  # llama.cpp's programs: --load-mode from the environment


def thp_mode(setting: str = THP_SETTING) -> str | None:
    """The kernel's transparent huge pages: 'always', 'madvise' or 'never' (None: not Linux, or unknown)."""
    try:
        with open(setting, encoding="ascii", errors="replace") as file:
            text = file.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """glibc's (major, minor) in this process, None under another C library."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def _tunables(env: Mapping[str, str]) -> list[str]:
    return [item for item in env.get("GLIBC_TUNABLES", "").split(":") if item]


def start_environment(
    env: Mapping[str, str], *, thp: str | None, glibc: tuple[int, int] | None
) -> dict[str, str] | None:
    """The environment to start this program again with, for huge pages; None where that changes nothing
    (set already, switched off, THP `always` or `never`, no glibc or one too old)."""
    if env.get(SWITCH) in ("0", ADDED) or thp != "madvise" or glibc is None or glibc < MIN_GLIBC:
        return None
    tunables = _tunables(env)
    if any(item.startswith("glibc.malloc.hugetlb=") for item in tunables):
        return None  # the user's own choice
    return {**env, "GLIBC_TUNABLES": ":".join([*tunables, TUNABLE]), SWITCH: ADDED}


def restart_with_huge_pages() -> None:
    """Start this program again, the same command line, with huge pages; returns where that changes
    nothing. Called first thing, before any thread, file or model is open."""
    env = start_environment(os.environ, thp=thp_mode(), glibc=glibc_version())
    argv = list(getattr(sys, "orig_argv", []))
    if env is None or not argv or not sys.executable:
        return
    try:  # (nothing is printed before: no buffer to flush, and stdout may be closed, sys.stdout None)
        os.execve(sys.executable, argv, env)
    except OSError:
        return  # not allowed here (a sandbox): go on with 4 KiB pages


def program_environment(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The environment the program has once started, started from `env` (this process's by default): what
    a script that starts `specgguf` as a process (bench_traces.py's server) gives it, with huge pages."""
    env = os.environ if env is None else env
    return start_environment(env, thp=thp_mode(), glibc=glibc_version()) or env


def in_use(env: Mapping[str, str] | None = None, *, thp: str | None = None) -> bool:
    """Whether llama.cpp's large buffers in a process with `env` get huge pages."""
    env = os.environ if env is None else env
    thp = thp_mode() if thp is None else thp
    if env.get(SWITCH) == "0":
        return False  # switched off: nothing of ours (a model is mapped, as llama.cpp has it)
    if thp == "always":
        return True
    return thp == "madvise" and TUNABLE in _tunables(env) and glibc_version() is not None


def read_into_memory(path: str | os.PathLike[str], *, local: bool) -> bool:
    """Whether to read a model wholly into (huge-paged) memory rather than map its file: with huge pages,
    a model all on this CPU (`local`), and a file that takes less than half the memory available."""
    if not (local and in_use()):
        return False
    try:
        return os.stat(path).st_size < _available_bytes() // 2
    except OSError:
        return False


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as file:
            lines = file.read().splitlines()
        for line in lines:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def for_llama_cpp(env: Mapping[str, str], *, same_as_ours: bool) -> dict[str, str]:
    """The environment for one of llama.cpp's programs: as users run it (without what this program added
    when it started), or with `same_as_ours` the huge pages and load mode this program has or, run from a
    script that did not start it, would have."""
    out = dict(env)
    if same_as_ours:
        if in_use(program_environment(env)):
            out["GLIBC_TUNABLES"] = ":".join(dict.fromkeys([*_tunables(env), TUNABLE]))
            out[LOAD_MODE] = "none"  # as `read_into_memory` has ours
        return out
    if out.pop(SWITCH, None) == ADDED:
        kept = [item for item in _tunables(out) if item != TUNABLE]
        if kept:
            out["GLIBC_TUNABLES"] = ":".join(kept)
        else:
            out.pop("GLIBC_TUNABLES", None)
    return out


def describe(env: Mapping[str, str] | None = None) -> str:
    """One line on this process's pages, for benchmark reports."""
    thp = thp_mode()
    if (os.environ if env is None else env).get(SWITCH) == "0":
        return f"huge pages: off ({SWITCH}=0, THP {thp})"
    if thp is None:
        return "huge pages: unknown (no /sys/kernel/mm/transparent_hugepage)"
    if thp == "always":
        return "huge pages: on (THP always)"
    if in_use(env, thp=thp):
        return f"huge pages: on (THP {thp}, {TUNABLE})"
    return f"huge pages: off (THP {thp})"
