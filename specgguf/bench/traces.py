"""Replayable client traces (bench/traces/*.jsonl): timed requests as a client sends them, validated on load.

A trace is JSON Lines. The first line names it:

    {"trace": "editor", "description": "..."}

and every other line is one request, in the order the client sent it:

    {"path": "/infill", "gap_s": 0.8, "body": {...}}
    {"path": "/v1/chat/completions", "gap_s": 4.0, "history": "replay", "body": {"messages": [...]}}

`path` is the API, `body` the JSON the client posts, `gap_s` the seconds since the previous request
was sent (the user typing or reading). `"history": "replay"` (chat only) puts in front of the body's
messages the previous request's messages and the answer this server gave it: each server then sees
its own history, as a user chatting with it would. Blank lines are skipped. A mistake names the
file and its line, as the suite does (bench/suite.py). scripts/make_traces.py writes the shipped ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import SpecggufError

PATHS = ("/infill", "/v1/chat/completions", "/v1/completions")
CHAT = "/v1/chat/completions"
SHIPPED = ("editor", "agent", "chat")
_HEADER_KEYS = {"trace": str, "description": str}
_REQUEST_KEYS = ("path", "gap_s", "body", "history")
MAX_TRACE_BYTES = 16 << 20


class TraceError(SpecggufError):
    """A trace file is malformed: the message names its file and line."""


@dataclass(frozen=True)
class TraceRequest:
    line: int  # where it is in its file, for messages
    path: str
    gap_s: float
    body: dict[str, Any]
    replay_history: bool  # chat: previous messages and this server's answer go in front of body's messages


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    requests: tuple[TraceRequest, ...]

    def cut(self, n: int | None) -> Trace:
        """The first n requests (None: all)."""
        return self if n is None else Trace(self.name, self.description, self.requests[:n])


def shipped_path(name: str) -> Path:
    return Path(str(resources.files("specgguf").joinpath("bench").joinpath("traces").joinpath(f"{name}.jsonl")))


def load_trace(name_or_path: str) -> Trace:
    """A shipped trace by name (editor, agent, chat) or a trace file by its path."""
    path = shipped_path(name_or_path) if name_or_path in SHIPPED else Path(name_or_path)
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: over {MAX_TRACE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"cannot read the trace {path}: {getattr(error, 'strerror', None) or error}") from None
    return parse_trace(text, source=str(path))


def parse_trace(text: str, *, source: str) -> Trace:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise TraceError(f"{source}: empty (a header line, then one request a line)")
    number, line = lines[0]
    header = _object(line, f"{source}:{number}")
    for key, value in header.items():
        if key not in _HEADER_KEYS:
            raise TraceError(f"{source}:{number}: unknown header key {key!r} (known: {', '.join(_HEADER_KEYS)})")
        if not isinstance(value, str) or not value.strip():
            raise TraceError(f"{source}:{number}: the header's {key} must be a non-empty text")
    if "trace" not in header:
        raise TraceError(f'{source}:{number}: the first line is the header naming the trace: {{"trace": NAME}}')
    requests = tuple(_request(_object(line, f"{source}:{n}"), f"{source}:{n}", n) for n, line in lines[1:])
    if not requests:
        raise TraceError(f"{source}: no requests after the header")
    if requests[0].replay_history:
        raise TraceError(f"{source}:{requests[0].line}: the first request has no history to replay")
    return Trace(header["trace"], header.get("description", ""), requests)


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as error:
        raise TraceError(f"{where}: not JSON: {error}") from None
    if not isinstance(value, dict):
        raise TraceError(f"{where}: expected a JSON object")
    return value


def _request(entry: dict[str, Any], where: str, line: int) -> TraceRequest:
    unknown = [key for key in entry if key not in _REQUEST_KEYS]
    if unknown:
        raise TraceError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_REQUEST_KEYS)})")
    missing = [key for key in ("path", "gap_s", "body") if key not in entry]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    path, gap, body, history = entry["path"], entry["gap_s"], entry["body"], entry.get("history")
    if path not in PATHS:
        raise TraceError(f"{where}: path {path!r} is not one of {', '.join(PATHS)}")
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 <= gap <= 3600:
        raise TraceError(f"{where}: gap_s must be seconds from 0 to 3600, got {gap!r}")
    if not isinstance(body, dict):
        raise TraceError(f"{where}: body must be a JSON object")
    if history not in (None, "replay"):
        raise TraceError(f'{where}: history takes only "replay", got {history!r}')
    if path == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise TraceError(f"{where}: a chat body needs a non-empty list of messages")
    elif history is not None:
        raise TraceError(f"{where}: history replays chat messages: only on {CHAT}")
    elif path == "/infill" and not all(isinstance(body.get(key, ""), str) for key in ("input_prefix", "prompt")):
        raise TraceError(f"{where}: input_prefix and prompt must be texts")
    return TraceRequest(line, path, float(gap), body, history == "replay")
