"""specgguf: speculative decoding for llama.cpp GGUF models.

Started as the program (`specgguf`, `python -m specgguf`), this runs before anything else of ours: a
Ctrl-C from here until `__main__.main` takes over is exit 130 with one line, never a traceback. It
imports nothing that is not loaded already when Python starts (`_signal`, not `signal`, whose import
builds enums for a millisecond: a Ctrl-C in it was a traceback), so the handler is in place at once.
"""

import _signal  # type: ignore[import-not-found]  # typeshed has no stub for the C module `signal` wraps
import os as _os
import sys as _sys


def _interrupted_at_start(signum, frame):  # pragma: no cover - the first milliseconds of the program
    _os.write(2, b"specgguf: error: interrupted\n")
    _os._exit(130)


def _started_as_program() -> bool:
    orig = list(getattr(_sys, "orig_argv", []))
    as_module = "-m" in orig[:-1] and orig[orig.index("-m") + 1] == "specgguf"
    return as_module or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "specgguf"


# Also where the parent left SIGINT ignored (a job a script put in the background): the program
# answers a Ctrl-C (or a `kill -INT`) all the same, as it always has from `__main__.main` on.
if _started_as_program() and _signal.getsignal(_signal.SIGINT) in (_signal.default_int_handler, _signal.SIG_IGN):
    _signal.signal(_signal.SIGINT, _interrupted_at_start)
