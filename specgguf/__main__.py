"""`python -m specgguf`, and the `specgguf` command's entry point.

The command line's imports (Typer, Rich, numpy) take a moment: a Ctrl-C during them is
exit 130 with one line, like a Ctrl-C at any later moment, never a traceback; before `main`
runs, specgguf/__init__.py's handler does the same.
"""

import signal
import sys


def main() -> int:
    try:
        # From here a Ctrl-C is a KeyboardInterrupt, caught below or by the command line's edge
        # (until now, specgguf/__init__.py's handler made it exit 130 at once).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from .cli.app import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("specgguf: error: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
