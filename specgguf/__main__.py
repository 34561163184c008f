"""`python -m specgguf`, and the `specgguf` command's entry point.

The command line's imports (Typer, Rich, numpy) take a moment. A Ctrl-C during them is exit 130
with one line, like a Ctrl-C at any later moment, never a traceback: specgguf/__init__.py's
handler is in place until they are done (it exits at once; nothing is open yet). `main` installs
it first thing too, for a program started under another name than `specgguf`, and this module
imports nothing that takes time (not even `signal`) before it. Raised as a KeyboardInterrupt
inside an import instead, Python 3.11 can wrap it in a RuntimeError (a class body's
`__set_name__`), which no `except KeyboardInterrupt` would see.

Before all that, started as the program, it starts itself again with glibc's huge pages where the
kernel gives them only on request (llama/huge_pages.py): the same command line, the same process id.
"""

import _signal  # type: ignore[import-not-found]  # loaded when Python starts: `signal` takes a millisecond
import sys

from . import _catch_ctrl_c_at_start, _started_as_program
from .llama.huge_pages import restart_with_huge_pages


def _is_interrupt(error: BaseException) -> bool:
    """A KeyboardInterrupt, or an error Python raised because of one (`__cause__` chain)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__
    return False


def main() -> int:
    if _started_as_program():  # not a test calling main(): that would replace the test's process
        restart_with_huge_pages()  # llama.cpp's buffers in 2 MiB pages (llama/huge_pages.py); returns if set
    _catch_ctrl_c_at_start()
    try:
        try:
            from .cli.app import main as cli_main
        finally:
            # From here a Ctrl-C is a KeyboardInterrupt, caught by the command line's edge or below.
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        return cli_main()
    except (KeyboardInterrupt, RuntimeError) as error:
        if not _is_interrupt(error):
            raise
        if sys.stderr is not None:
            sys.stderr.write("specgguf: error: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
