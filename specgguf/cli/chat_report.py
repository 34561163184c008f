"""What `specgguf chat` says about a conversation: the line after each answer, `/stats`, and `/save`."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from ..core.events import GenerationStats
from ..errors import terminal_safe
from .chat_session import ChatSession, Turn


def _acceptance(stats: GenerationStats) -> str:
    rate = stats.acceptance_rate
    return "plain decoding" if rate is None else f"acceptance {rate:.0%} ({stats.n_accepted}/{stats.n_drafted})"


def turn_line(turn: Turn) -> str:
    """The short stats line after an answer."""
    stats = turn.stats
    first = f"first token {turn.first_token_seconds:.2f} s" if turn.first_token_seconds is not None else "no tokens"
    reused = turn.n_prompt - turn.n_evaluated.get("verifier", turn.n_prompt)
    return (
        f"{stats.n_tokens} tokens · {stats.tokens_per_second:.1f} tok/s · {_acceptance(stats)}"
        f" · {first} · prompt {turn.n_prompt} tokens, {reused} cached"
    )


def stats_report(session: ChatSession) -> list[str]:
    """`/stats`: totals since the start (or /reset), per-position acceptance, prompt reuse."""
    totals, turns = session.totals, session.transcript
    answers = f"{len(turns)} answer" + ("" if len(turns) == 1 else "s")
    lines = [
        f"{answers} · {totals.n_tokens} tokens in {totals.wall_seconds:.2f} s"
        f" · {totals.tokens_per_second:.1f} tok/s · {_acceptance(totals)}"
        f" · {totals.tokens_per_step:.2f} tokens/step"
    ]
    if totals.drafted_by_position:
        positions = "  ".join(
            f"{i + 1}: {accepted / drafted:.0%}"
            for i, (accepted, drafted) in enumerate(zip(totals.accepted_by_position, totals.drafted_by_position))
        )
        lines.append(f"acceptance by draft position: {positions}")
    if turns:
        prompt = sum(turn.n_prompt for turn in turns)
        evaluated = sum(turn.n_evaluated.get("verifier", 0) for turn in turns)
        firsts = [turn.first_token_seconds for turn in turns if turn.first_token_seconds is not None]
        first = f" · first token: last {firsts[-1]:.2f} s, mean {sum(firsts) / len(firsts):.2f} s" if firsts else ""
        lines.append(
            f"prompt tokens: {prompt} in all, {evaluated} evaluated, {prompt - evaluated} from the cache" + first
        )
    in_use = turns[-1].n_prompt + turns[-1].stats.n_tokens if session.in_context else 0
    dropped = f" · {session.first_in_context} oldest turns dropped" if session.first_in_context else ""
    lines.append(
        f"{session.k_source} · temperature {session.settings.temperature:g}"
        f" · context {in_use}/{session.n_ctx} tokens{dropped}"
    )
    return lines


def transcript_json(session: ChatSession, *, models: dict[str, str | None]) -> str:
    turns = [
        {
            "user": turn.question,
            "assistant": turn.answer,
            "stop": turn.stop,
            "in_context": index >= session.first_in_context,
            "n_tokens": turn.stats.n_tokens,
            "acceptance_rate": turn.stats.as_dict()["acceptance_rate"],
            "first_token_seconds": turn.first_token_seconds and round(turn.first_token_seconds, 4),
            "prompt_tokens": turn.n_prompt,
            "prompt_tokens_evaluated": turn.n_evaluated,
        }
        for index, turn in enumerate(session.transcript)
    ]
    document = {
        "models": models,
        "system": session.system,
        "settings": {
            "k": session.k_source,
            "max_tokens": session.max_tokens,
            "seed": session.seed,
            **asdict(session.settings),
        },
        "turns": turns,
        "totals": session.totals.as_dict(),
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def transcript_markdown(session: ChatSession, *, models: dict[str, str | None]) -> str:
    saved = datetime.now(timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M")
    names = " · ".join(f"{role}: `{name}`" for role, name in models.items() if name)
    parts = [f"# specgguf chat, {saved}\n\n{names}\n"]
    if session.system:
        parts.append(f"## System\n\n{session.system}\n")
    for turn in session.transcript:
        parts.append(f"## User\n\n{turn.question}\n")
        note = {
            "interrupted": "\n\n*(interrupted)*",
            "context": "\n\n*(cut: the context was full)*",
            "max_tokens": "\n\n*(cut at the token limit)*",
        }.get(turn.stop or "", "")
        parts.append(f"## Assistant\n\n{turn.answer.strip()}{note}\n")
    return "\n".join(parts)


def save_command(session: ChatSession, argument: str, *, models: dict[str, str | None]) -> tuple[str, str]:
    """`/save FILE`: what to tell the user (and its style); a bad path is one line and the chat goes on."""
    if not argument:
        return "usage: /save FILE (FILE.json: JSON, otherwise Markdown)", "yellow"
    if "\x00" in argument:
        return "could not save: a file name cannot hold a NUL byte", "yellow"
    try:
        path = Path(argument).expanduser()
    except RuntimeError:  # ~nosuchuser/...
        return f"could not save {terminal_safe(argument)}: no such user's home folder", "yellow"
    try:
        kind = save_transcript(session, path, models=models)
    except (OSError, ValueError) as error:
        return f"could not save {terminal_safe(str(path))}: {getattr(error, 'strerror', None) or error}", "yellow"
    return f"saved {len(session.transcript)} turns to {terminal_safe(str(path))} ({kind})", "dim"


def save_transcript(session: ChatSession, path: Path, *, models: dict[str, str | None]) -> str:
    """Write the transcript: JSON for a .json file, Markdown otherwise. Returns the format's name."""
    as_json = path.suffix.lower() == ".json"
    text = (transcript_json if as_json else transcript_markdown)(session, models=models)
    write_replacing(Path(os.path.realpath(path)), text)
    return "JSON" if as_json else "Markdown"


def write_replacing(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, renamed over it once written (a full
    disk leaves the old file as it was, and no temporary file)."""
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with open(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            mode = path.stat().st_mode & 0o777  # an existing file keeps its permissions
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
