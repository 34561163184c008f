"""`python -m specgguf`, and the `specgguf` command's entry point.

The command line's imports (Typer, Rich, numpy) take a moment. A Ctrl-C during them is exit 130
with one line, like a Ctrl-C at any later moment, never a traceback: specgguf/__init__.py's
handler is in place until they are done (it exits at once; nothing is open yet). `main` installs
it first thing too, for a program started under another name than `specgguf`, and this module
imports nothing that takes time (not even `signal`) before it. Raised as a KeyboardInterrupt
inside an import instead, Python 3.11 can wrap it in a RuntimeError (a class body's
`__set_name__`), which no `except KeyboardInterrupt` would see.
"""

import _signal  # type: ignore[import-not-found]  # loaded when Python starts: `signal` takes a millisecond
import sys

from . import _catch_ctrl_c_at_start


def _is_interrupt(error: BaseException) -> bool:
    """A KeyboardInterrupt, or an error Python raised because of one (`__cause__` chain)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__
    return False


def main() -> int:
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
