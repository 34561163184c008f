"""The command line: the Typer app and the one place where errors become one line and an exit code.

Commands gather options and call keyword-only functions (commands.py: run, chat, serve;
tool_commands.py: the rest). Set SPECGGUF_DEBUG=1 to see tracebacks (and llama.cpp's own log).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Annotated

import typer
from typer.exceptions import TyperException

from ..errors import SpecggufError, debug_enabled, terminal_safe
from . import commands, tool_commands
from .options import ReaderGone

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Speculative decoding for llama.cpp GGUF models: the big model's answers, sooner.",
)


def _print_version(asked: bool) -> None:
    if not asked:
        return
    try:
        version = metadata.version("specgguf")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "(unknown: not installed as a package)"
    typer.echo(f"specgguf {version}")
    raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Speculative decoding for llama.cpp GGUF models: the big model's answers, sooner."""


for _command in (
    commands.run,
    tool_commands.bench,
    tool_commands.pull,
    tool_commands.pairs,
    tool_commands.check,
    commands.chat,
    commands.serve,
    tool_commands.worker,
):
    app.command()(_command)


def _fail(message: str, code: int) -> int:
    if sys.stderr is not None:
        sys.stderr.write(f"specgguf: error: {terminal_safe(message)}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure is one line on stderr and a non-zero exit code."""
    debug = debug_enabled()
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        return _fail("standard output is closed; redirect it instead (e.g. >/dev/null)", 2)
    try:
        # Without standalone mode, typer *returns* the code of a `typer.Exit` (and 130 for Ctrl-C).
        code = app(args=argv, prog_name="specgguf", standalone_mode=False)
        if code == 130:
            return _fail("interrupted", 130)
        return code if isinstance(code, int) else 0
    except SpecggufError as error:
        if debug:
            raise
        return _fail(str(error), error.exit_code)
    except typer.Exit as exit_:
        return exit_.exit_code
    except typer.Abort:
        return _fail("interrupted", 130)
    except TyperException as error:  # bad options: typer's (click's) message, on one line
        return _fail(error.format_message().replace("\n", " "), getattr(error, "exit_code", 2))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except (ReaderGone, BrokenPipeError):
        # The reader went away (`| head -1`): stop quietly, and keep Python's
        # own flush at exit from complaining about the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as error:
        if debug:
            raise
        return _fail(str(error), 1)


if __name__ == "__main__":
    sys.exit(main())
