"""`python -m specgguf`, and the `specgguf` command's entry point.

The command line's imports (Typer, Rich, numpy) take a moment: a Ctrl-C during them is
exit 130 with one line, like a Ctrl-C at any later moment, never a traceback.
"""

import sys


def main() -> int:
    try:
        from .cli.app import main as cli_main
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("specgguf: error: interrupted\n")
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
