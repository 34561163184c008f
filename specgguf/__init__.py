"""specgguf: speculative decoding for llama.cpp GGUF models.

Started as the program (`specgguf`, `python -m specgguf`), this runs before anything else of ours: a
Ctrl-C from here until `__main__.main` takes over is exit 130 with one line, never a traceback. It
imports nothing that is not loaded already when Python starts (`_signal`, not `signal`, whose import
builds enums for a millisecond: a Ctrl-C in it was a traceback), so the handler is in place at once.
The program's name is read as the console script has it on any system (`specgguf.exe` and the
other names of pip's Windows launchers, a symlink to it); under any other name `__main__.main`
installs the same handler first thing, and `__main__` imports nothing slow before it.
"""

import _signal  # type: ignore[import-not-found]  # typeshed has no stub for the C module `signal` wraps
import os as _os
import sys as _sys


def _interrupted_at_start(signum, frame):  # pragma: no cover - the first milliseconds of the program
    _os.write(2, b"specgguf: error: interrupted\n")
    _os._exit(130)


def _program_name(path: str) -> str:
    name = _os.path.basename(path)
    for suffix in (".exe", "-script.pyw", "-script.py"):  # pip's launchers on Windows
        name = name.removesuffix(suffix)
    return name


def _started_as_program() -> bool:
    orig = list(getattr(_sys, "orig_argv", []))
    if "-m" in orig[:-1] and orig[orig.index("-m") + 1] == "specgguf":
        return True
    script = _sys.argv[0] if _sys.argv else ""
    return "specgguf" in (_program_name(script), _program_name(_os.path.realpath(script)))  # a symlink's target


def _catch_ctrl_c_at_start() -> None:
    """From now until the command line's imports are done, a Ctrl-C exits at once with one line.
    Also where the parent left SIGINT ignored (a job a script put in the background): the program
    answers a Ctrl-C (or a `kill -INT`) all the same, as it always has from `__main__.main` on."""
    if _signal.getsignal(_signal.SIGINT) in (_signal.default_int_handler, _signal.SIG_IGN):
        _signal.signal(_signal.SIGINT, _interrupted_at_start)


if _started_as_program():
    _catch_ctrl_c_at_start()
