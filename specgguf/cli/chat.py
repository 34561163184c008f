"""`specgguf chat`'s terminal side: lines in, slash commands, streamed answers, Ctrl-C.

On a terminal: a `>>> ` prompt with readline editing and a history file that
is only ever appended to; answers coloured like `run`'s. Piped (stdin not a
terminal): every line is a question, answers are plain text separated by a
blank line. Answers go to stdout; everything else to stderr.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..core.engine import KPolicy
from ..core.sampling import SamplingSettings
from ..errors import SpecggufError
from ..files.resolve import ResolvedPair
from ..kchoice import KChoice, parse_k
from ..prepare import MEASURING, DraftOptions, LoadOptions, Prepared, prepare, where_line
from .chat_report import save_command, stats_report, turn_line
from .chat_session import ChatSession
from .ctrl_c import LeftWithCtrlC, ctrl_c_sets
from .render import TokenStream, legend

PROMPT = ">>> "
HISTORY_KEEP = 5000  # lines kept when the history file has grown past twice this

HELP = """\
/help         this list
/stats        totals so far: acceptance (also by draft position), tokens/s, prompt reuse
/k N          draft N tokens per step (0: the verifier alone); /k adaptive, /k auto as with -k
/temp X       sampling temperature (0: greedy)
/n N          at most N tokens per answer
/reset        forget the conversation and the totals (the system prompt stays)
/save FILE    write the transcript: FILE.json as JSON, anything else as Markdown
/exit         leave (so do Ctrl-D and, at the prompt, Ctrl-C)
Ctrl-C during an answer stops it (twice: leaves). Start a line with // to send one that begins with /."""


def history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "specgguf" / "chat_history"


class TerminalInput:
    """input() with readline: line editing, and history shared across sessions.

    Each line is appended to the history file as it is entered (never rewritten
    in place), so a crash loses at most that line and never truncates the file.
    """

    def __init__(self, path: Path | None):
        self.path = path
        try:
            import readline  # importing it gives input() line editing
        except ImportError:  # no readline on this platform: plain input()
            self.readline = None
            return
        self.readline = readline
        if path is None:
            return
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            _trim(path)
            if path.exists():
                readline.read_history_file(str(path))

    def read(self) -> str | None:
        try:
            line = input(PROMPT)
        except EOFError:
            return None
        if line.strip() and self.readline is not None and self.path is not None:
            with contextlib.suppress(OSError, AttributeError):  # AttributeError: libedit may lack it
                if not self.path.exists():
                    self.path.touch(mode=0o600)
                self.readline.append_history_file(1, str(self.path))
        return line


def _trim(path: Path) -> None:
    """Keep the history file from growing forever: rewrite its tail to a new file, then rename."""
    if not path.exists() or path.stat().st_size < HISTORY_KEEP * 40:
        return
    lines = path.read_bytes().splitlines(keepends=True)
    if len(lines) > 2 * HISTORY_KEEP:
        partial = path.with_name(path.name + ".incomplete")
        partial.write_bytes(b"".join(lines[-HISTORY_KEEP:]))
        os.replace(partial, path)


class PipedInput:
    def __init__(self, stream: TextIO):
        self.stream = stream
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError):
                stream.reconfigure(errors="replace")  # a stray byte is not worth a traceback

    def read(self) -> str | None:
        line = self.stream.readline()
        return line.rstrip("\r\n") if line else None


class ChatRepl:
    def __init__(
        self,
        session: ChatSession,
        *,
        reader,
        interactive: bool,
        out: TextIO,
        out_console: Console | None,
        err_console: Console,
        quiet: bool,
        show_rejected: bool,
        models: dict[str, str | None],
        k_choice: KChoice,
        choose_k,
    ):
        self.session, self.reader, self.interactive = session, reader, interactive
        self.k_choice, self.choose_k = k_choice, choose_k  # choose_k(choice, temperature) -> (policy, source)
        self.out, self.out_console, self.err = out, out_console, err_console
        self.quiet, self.show_rejected, self.models = quiet, show_rejected, models
        self.n_answers = 0
        self.n_failed = 0  # questions that got no complete answer because of an error (not Ctrl-C)

    def note(self, message: str, style: str = "yellow") -> None:
        self.err.print(Text(message, style=style), soft_wrap=True)

    def loop(self) -> None:
        try:
            while (line := self.reader.read()) is not None:
                if not line.strip():
                    continue
                if line.startswith("/") and not line.startswith("//"):
                    if not self.command(line.strip()):
                        return
                    continue
                self.answer(line[1:] if line.startswith("//") else line)
        except KeyboardInterrupt:  # Ctrl-C at the prompt (during an answer it only stops the answer)
            pass
        if self.interactive:
            self.err.print()

    # --- slash commands; each returns False to leave ---
    def command(self, line: str) -> bool:
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        session = self.session
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name in ("/help", "/?"):
            self.note(HELP, style="")
        elif name == "/stats":
            for text in stats_report(session):
                self.note(text, style="")
        elif name == "/k":
            self.set_k(argument)
        elif name == "/temp":
            try:
                session.settings = replace(session.settings, temperature=float(argument))
            except ValueError:
                self.note("usage: /temp X, a number >= 0 (0: greedy)")
                return True
            if self.k_choice.mode == "auto":  # the stored best K differs for greedy and sampled
                session.policy, session.k_source = self.choose_k(self.k_choice, session.settings.temperature)
            self.note(f"temperature {session.settings.temperature:g}", style="dim")
        elif name == "/n":
            if not argument.isdigit() or int(argument) < 1:
                self.note("usage: /n N, a whole number >= 1")
            else:
                session.max_tokens = int(argument)
                self.note(f"at most {session.max_tokens} tokens per answer", style="dim")
        elif name == "/reset":
            session.reset()
            self.note("conversation forgotten" + (" (the system prompt stays)" if session.system else ""), style="dim")
        elif name == "/save":
            self.save(argument)
        else:
            self.note(f"unknown command {name}; /help lists them (start with // to send a line beginning with /)")
        return True

    def set_k(self, argument: str) -> None:
        try:
            choice = parse_k(argument or None) if argument else None
        except SpecggufError:
            choice = None
        if choice is None:
            self.note("usage: /k N (0: the verifier alone), /k adaptive or /k auto")
            return
        if self.session.drafter is None:
            self.note("no draft model (-md): the verifier decodes alone whatever K is")
            return
        self.k_choice = choice
        self.session.policy, self.session.k_source = self.choose_k(choice, self.session.settings.temperature)
        self.note(self.session.k_source, style="dim")

    def save(self, argument: str) -> None:
        self.note(*save_command(self.session, argument, models=self.models))

    # --- answers ---
    def answer(self, question: str) -> None:
        stop, leave = threading.Event(), threading.Event()
        with ctrl_c_sets(stop, leave):
            try:
                reply = self.session.ask(question)
            except SpecggufError as error:  # a message too long for the context, a failing template
                self.note(str(error))
                self.n_failed += 1
                return
            if reply.n_dropped:
                kept = ", kept the system prompt" if self.session.system else ""
                self.note(
                    f"the context ({self.session.n_ctx} tokens) is full: dropped the {reply.n_dropped}"
                    f" oldest turn{'s' if reply.n_dropped > 1 else ''}{kept}"
                )
            if not self.interactive and self.n_answers:
                self.out.write("\n")  # piped: a blank line between answers
            self.n_answers += 1
            stream = TokenStream(
                self.session.verifier.token_bytes,
                console=self.out_console,
                out=self.out,
                show_rejected=self.show_rejected,
            )
            interrupted, failure = False, ""
            try:
                for event in reply:
                    stream.write(event)
                    if stop.is_set():
                        interrupted = True
                        break
            except KeyboardInterrupt:  # (not from Ctrl-C, which only sets stop/leave): drop what may be half done
                interrupted = True
                self.session.forget_caches()
            except SpecggufError as error:  # llama.cpp failed mid-answer: say so, keep the conversation
                interrupted, failure = True, str(error)
                self.session.forget_caches()
            turn = reply.finish(interrupted=interrupted)
            stream.finish()
        if failure:
            self.note(f"the answer stopped: {failure}")
            self.n_failed += 1
        elif interrupted:
            self.note("(interrupted)", style="dim")
        elif turn.stop == "context":
            self.note(
                f"the context ({self.session.n_ctx} tokens) is full: the answer was cut; the oldest turns"
                " will make room for the next question"
            )
        if not self.quiet:
            self.note(turn_line(turn), style="dim")
        if leave.is_set():
            raise LeftWithCtrlC("interrupted")


def _greet(session: ChatSession, models: dict[str, str | None], err_console: Console, *, show_legend: bool) -> None:
    """The interactive chat's first lines: the pair, where K comes from, and what is missing."""
    names = " + ".join(name for name in models.values() if name)
    err_console.print(
        Text(f"specgguf chat · {names} · {session.k_source} · /help for commands, Ctrl-D to leave", style="dim")
    )
    if session.drafter is None:
        err_console.print("no draft model given (-md): decoding with the verifier alone", style="yellow")
    if not session.has_template:
        err_console.print(f"{models['verifier']} has no chat template: using ChatML", style="yellow")
    if show_legend:
        err_console.print(legend())


def _session(
    prepared: Prepared, *, system: str | None, max_tokens: int, settings: SamplingSettings, seed: int
) -> tuple[ChatSession, Callable[[KChoice, float], tuple[KPolicy, str]]]:
    """The conversation over the loaded pair, and how /k and /temp choose a new K policy."""

    def choose_k(choice: KChoice, temperature: float) -> tuple[KPolicy, str]:
        policy, source = prepared.policy(choice, temperature=temperature)
        return policy, str(source)

    policy, k_source = choose_k(prepared.options.k, settings.temperature)
    session = ChatSession(
        verifier=prepared.verifier,
        draft=prepared.draft,
        policy=policy,
        k_source=k_source,
        drafter=prepared.drafter(),
        system=system,
        max_tokens=max_tokens,
        settings=settings,
        seed=seed,
    )
    return session, choose_k


def run_chat(
    *,
    resolved: ResolvedPair,
    drafting: DraftOptions,
    max_tokens: int,
    settings: SamplingSettings,
    seed: int | None,
    load: LoadOptions,
    system: str | None,
    show_rejected: bool,
    quiet: bool,
    stdin: TextIO,
    out: TextIO,
    out_console: Console | None,
    err_console: Console,
) -> None:
    """Load the pair and talk until end of input, /exit, Ctrl-D or Ctrl-C at the prompt."""
    seed = seed if seed is not None else secrets.randbelow(2**31)
    # The draft model loads even at -k 0, so that /k can turn drafting on.
    prepared = prepare(
        resolved,
        load,
        drafting,
        keep_draft=True,
        on_measure=None if quiet else lambda: err_console.print(MEASURING, style="dim"),
        on_announce=None if quiet else lambda text: err_console.print(text, style="dim"),
    )
    verifier, draft = prepared.verifier, prepared.draft
    if load.rpc and not quiet:
        err_console.print(Text(where_line(verifier, draft), style="dim"))
    session, choose_k = _session(prepared, system=system, max_tokens=max_tokens, settings=settings, seed=seed)
    interactive = stdin.isatty()
    models = {"verifier": resolved.verifier.name, "draft": draft.path.name if draft is not None else None}
    if interactive:
        reader: TerminalInput | PipedInput = TerminalInput(history_path())
        if not quiet:
            _greet(session, models, err_console, show_legend=show_rejected and out_console is not None)
    else:
        reader, out_console = PipedInput(stdin), None
    repl = ChatRepl(
        session,
        reader=reader,
        interactive=interactive,
        out=out,
        out_console=out_console,
        err_console=err_console,
        quiet=quiet,
        show_rejected=show_rejected,
        models=models,
        k_choice=drafting.k,
        choose_k=choose_k,
    )
    try:
        repl.loop()  # a second Ctrl-C in an answer raises LeftWithCtrlC: the n-grams are kept all the same
    finally:
        prepared.save_ngrams()
        prepared.keep_learned_costs(repl.session.policy)  # the last K policy's (/k starts a new one)
    if repl.n_failed and not interactive:  # a script must see that some answers are missing
        raise SpecggufError(
            f"{repl.n_failed} question{'s' if repl.n_failed > 1 else ''} got no complete"
            " answer (see the messages above)"
        )
