"""`python -m specgguf`, and the `specgguf` command's entry point.

The command line's imports (Typer, Rich, numpy) take a moment. A Ctrl-C during them is exit 130
with one line, like a Ctrl-C at any later moment, never a traceback: specgguf/__init__.py's
handler stays in place until they are done (it exits at once; nothing is open yet). Raised as
a KeyboardInterrupt inside an import instead, Python 3.11 can wrap it in a RuntimeError (a class
body's `__set_name__`), which no `except KeyboardInterrupt` would see.
"""

import signal
import sys


def _is_interrupt(error: BaseException) -> bool:
    """A KeyboardInterrupt, or an error Python raised because of one (`__cause__` chain)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__
    return False


def main() -> int:
    try:
        from .cli.app import main as cli_main

        # From here a Ctrl-C is a KeyboardInterrupt, caught by the command line's edge or below.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return cli_main()
    except (KeyboardInterrupt, RuntimeError) as error:
        if not _is_interrupt(error):
            raise
        if sys.stderr is not None:
            sys.stderr.write("specgguf: error: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
