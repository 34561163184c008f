"""What `specgguf chat` says about a conversation: the line after each answer, `/stats`, and `/save`."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from ..core.stats import GenerationStats
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


def save_transcript(session: ChatSession, path: Path, *, models: dict[str, str | None]) -> str:
    """Write the transcript: JSON for a .json file, Markdown otherwise. Returns the format's name."""
    as_json = path.suffix.lower() == ".json"
    text = (transcript_json if as_json else transcript_markdown)(session, models=models)
    path.write_text(text, encoding="utf-8")
    return "JSON" if as_json else "Markdown"
