"""Huge pages for llama.cpp's buffers (specgguf/llama/huge_pages.py): when the program starts itself again
with glibc's tunable, what llama.cpp's programs get beside it in a benchmark, and the real program doing it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from live_server import live_server
from specgguf.llama import huge_pages
from specgguf.llama.huge_pages import ADDED, SWITCH, TUNABLE, for_llama_cpp, start_environment, thp_mode

GLIBC = (2, 36)


def test_with_thp_on_request_the_program_starts_again_with_the_tunable_and_a_mark():
    env = start_environment({"HOME": "/h", "GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, thp="madvise", glibc=GLIBC)
    assert env == {"HOME": "/h", "GLIBC_TUNABLES": f"glibc.pthread.rseq=0:{TUNABLE}", SWITCH: ADDED}
    assert start_environment({}, thp="madvise", glibc=GLIBC) == {"GLIBC_TUNABLES": TUNABLE, SWITCH: ADDED}


@pytest.mark.parametrize(
    ("env", "thp", "glibc"),
    [
        ({SWITCH: ADDED, "GLIBC_TUNABLES": TUNABLE}, "madvise", GLIBC),  # started again already: never a loop
        ({SWITCH: ADDED}, "madvise", GLIBC),  # even where something took the tunable away since
        ({SWITCH: "0"}, "madvise", GLIBC),  # switched off
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC),  # the user's own choice
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, "madvise", GLIBC),  # (hugetlbfs pages)
        ({}, "always", GLIBC),  # every large block has them already
        ({}, "never", GLIBC),  # none can
        ({}, None, GLIBC),  # not Linux
        ({}, "madvise", (2, 34)),  # a glibc without the tunable
        ({}, "madvise", None),  # another C library
    ],
)
def test_where_starting_again_changes_nothing_it_does_not(env, thp, glibc):
    assert start_environment(env, thp=thp, glibc=glibc) is None


def test_the_kernel_setting_is_the_bracketed_word(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert thp_mode(str(setting)) == "madvise"
    setting.write_text("[always] madvise never\n")
    assert thp_mode(str(setting)) == "always"
    setting.write_text("garbled\n")
    assert thp_mode(str(setting)) is None
    assert thp_mode(str(tmp_path / "missing")) is None


def test_llama_cpp_programs_run_as_users_run_them_without_what_we_added():
    ours = {"PATH": "/bin", "GLIBC_TUNABLES": f"glibc.pthread.rseq=0:{TUNABLE}", SWITCH: ADDED}
    assert for_llama_cpp(ours, same_as_ours=False) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=0"}
    assert for_llama_cpp({"GLIBC_TUNABLES": TUNABLE, SWITCH: ADDED}, same_as_ours=False) == {}
    users = {"GLIBC_TUNABLES": TUNABLE}  # set by the user, not by us: theirs to keep
    assert for_llama_cpp(users, same_as_ours=False) == users


def test_llama_cpp_programs_get_the_same_pages_and_load_mode_when_asked(monkeypatch):
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "glibc_version", lambda: GLIBC)
    same = for_llama_cpp({"PATH": "/bin"}, same_as_ours=True)  # from a script that did not start again
    assert same == {"PATH": "/bin", "GLIBC_TUNABLES": TUNABLE, huge_pages.LOAD_MODE: "none"}
    assert for_llama_cpp({"GLIBC_TUNABLES": TUNABLE, SWITCH: ADDED}, same_as_ours=True)["GLIBC_TUNABLES"] == TUNABLE
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "never")
    assert for_llama_cpp({"PATH": "/bin"}, same_as_ours=True) == {"PATH": "/bin"}


@pytest.mark.parametrize("thp", ["always", "madvise"])
def test_switched_off_nothing_is_ours_even_where_the_kernel_gives_huge_pages_to_all(thp):
    assert huge_pages.in_use({}, thp="always")  # (the kernel's: a model is read into them)
    assert not huge_pages.in_use({SWITCH: "0", "GLIBC_TUNABLES": TUNABLE}, thp=thp)  # mapped, as llama.cpp has it


def test_a_model_is_read_into_memory_only_with_huge_pages_all_here_and_room(monkeypatch, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 1000)
    monkeypatch.setattr(huge_pages, "in_use", lambda: True)
    monkeypatch.setattr(huge_pages, "_available_bytes", lambda: 10_000)
    assert huge_pages.read_into_memory(model, local=True)
    assert not huge_pages.read_into_memory(model, local=False)  # layers on a GPU or a worker
    monkeypatch.setattr(huge_pages, "_available_bytes", lambda: 1_500)
    assert not huge_pages.read_into_memory(model, local=True)  # more than half the memory left: mapped
    monkeypatch.setattr(huge_pages, "in_use", lambda: False)
    monkeypatch.setattr(huge_pages, "_available_bytes", lambda: 10_000)
    assert not huge_pages.read_into_memory(model, local=True)


def _environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and transparent huge pages are Linux's")
@pytest.mark.parametrize("switch", [None, "0"])
def test_the_real_program_starts_again_in_its_own_process_with_huge_pages(tiny_verifier, switch):
    env = {name: value for name, value in os.environ.items() if name not in (SWITCH, "GLIBC_TUNABLES")}
    if switch is not None:
        env[SWITCH] = switch
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", env=env) as server:  # the Popen's own pid
        environ = _environ(server.process.pid)
        mapped = str(tiny_verifier) in Path(f"/proc/{server.process.pid}/maps").read_text()
    started_again = switch is None and start_environment({}, thp=thp_mode(), glibc=huge_pages.glibc_version())
    assert (f"GLIBC_TUNABLES={TUNABLE}" in environ) == bool(started_again)
    assert (f"{SWITCH}={ADDED}" in environ) == bool(started_again)
    pages = dict(item.partition("=")[::2] for item in environ if "=" in item)
    assert mapped == (not huge_pages.in_use(pages)), "with huge pages the weights are read, not mapped"
