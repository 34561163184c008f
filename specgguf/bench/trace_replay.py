"""Replay a trace (bench/traces.py) against several running servers (bench/trace_servers.py), interleaved
request by request: request 1 to every server in turn, then request 2, ... so that machine noise
hits every server alike. Each request is streamed; the client times the first token and the last.

Greedy by default: every body gets `temperature 0` and `top_k 1`, and a `samplers` chain without
top_k gets it in front (llama.vscode's chain, top_k;top_p;infill with no temperature, samples, and
its warm-up's empty chain samples its one token; top_k 1 makes any chain greedy), so the answers can
be compared with the reference's (llama-server plain). `stream` and `cache_prompt` are always on.
A chat line that replays history gets, in front of its messages, the previous request's messages
and the answer this server gave: each server sees its own history.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import SpecggufError
from .trace_servers import Running, log_tail
from .traces import CHAT, Trace, TraceRequest

REQUEST_SECONDS = 900.0
GREEDY = {"temperature": 0.0, "top_k": 1}


@dataclass(frozen=True)
class Reply:
    text: str  # the content, then each tool call as name(arguments), the arguments as compact JSON
    ttft_s: float | None  # to the first piece of an answer (None: no answer, e.g. n_predict 0)
    total_s: float
    n_tokens: int  # the server's own count (timings.predicted_n, else usage; not an end token), else the pieces
    error: str | None = None
    message: dict[str, Any] | None = None  # chat: the assistant message, for a history that replays it
    n_prompt: int | None = None  # the prompt's tokens, cached or evaluated (timings: cache_n + prompt_n)
    prompt_ms: float | None = None  # the server's own time for the prompt's pass (timings.prompt_ms)

    @property
    def tokens_per_second(self) -> float | None:
        """Generation after the first token: (n - 1) / (last - first), client-timed."""
        if self.ttft_s is None or self.n_tokens < 2 or self.total_s <= self.ttft_s:
            return None
        return (self.n_tokens - 1) / (self.total_s - self.ttft_s)


@dataclass
class Transcript:
    """One server's chat history so far (for lines that replay it)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    diverged: bool = False  # its history holds an answer unlike the reference's


def prepared_body(request: TraceRequest, transcript: Transcript, *, greedy: bool) -> dict[str, Any]:
    body = json.loads(json.dumps(request.body))  # a copy: the trace stays as loaded
    if request.replay_history:
        body["messages"] = [*transcript.messages, *body["messages"]]
    if greedy:
        body |= GREEDY
        samplers = body.get("samplers")  # a chain without top_k (the editors' warm-up: []) would sample
        if isinstance(samplers, list) and "top_k" not in samplers:
            body["samplers"] = ["top_k", *samplers]
        elif isinstance(samplers, str) and "k" not in samplers:
            body["samplers"] = "k" + samplers
    body |= {"stream": True, "cache_prompt": True}
    if request.path == CHAT:
        transcript.messages = list(body["messages"])
    return body


def send(client: httpx.Client, base_url: str, path: str, body: dict[str, Any], *, counts_eog: bool = False) -> Reply:
    """POST one streamed request and read its server-sent events to the end. `counts_eog`: the server counts
    the end-of-generation token among the tokens it generated (llama-server's `predicted_n` does, specgguf's
    does not): one fewer is the answer's, where the answer ended there."""
    start = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    counted: int | None = None
    n_prompt: int | None = None
    prompt_ms: float | None = None
    n_pieces, ended_at_eog = 0, False
    with client.stream("POST", base_url + path, json=body, timeout=REQUEST_SECONDS) as response:
        if response.status_code != 200:
            text = response.read().decode("utf-8", errors="replace")
            return Reply("", None, time.perf_counter() - start, 0, error=f"HTTP {response.status_code}: {text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                return Reply(
                    "", first and first - start, time.perf_counter() - start, 0, error=str(event["error"])[:300]
                )
            piece, calling = _piece(path, event, calls)
            if piece or calling:
                first = first or time.perf_counter()
                pieces.append(piece)
                n_pieces += 1
            counted = _count(event) or counted
            ended_at_eog = ended_at_eog or _ended_at_eog(path, event, body)
            n_prompt = _prompt_count(event) or n_prompt
            prompt_ms = _prompt_ms(event) or prompt_ms
    total = time.perf_counter() - start
    if counted and counts_eog and ended_at_eog:
        counted -= 1
    text = "".join(pieces)
    tool_calls = [calls[index] for index in sorted(calls)]
    shown = text + "".join(f"{call['name']}({_canonical(call['arguments'])})" for call in tool_calls)
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call["id"] or f"call_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for i, call in enumerate(tool_calls)
        ]
    ttft = None if first is None else first - start
    return Reply(shown, ttft, total, counted or n_pieces, message=message, n_prompt=n_prompt, prompt_ms=prompt_ms)


def _canonical(arguments: str) -> str:
    """A tool call's arguments as compact JSON with sorted keys: servers re-serialize what the model
    wrote differently (spaces, key order), and the comparison is of what it called, not the spelling."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return arguments


def _piece(path: str, event: dict[str, Any], calls: dict[int, dict[str, str]]) -> tuple[str, bool]:
    """The text this event adds to the answer, and whether it adds to a tool call (gathered into `calls`)."""
    if path == "/infill":
        return event.get("content") or "", False
    choices = event.get("choices") or [{}]
    if path != CHAT:
        return choices[0].get("text") or "", False
    delta = choices[0].get("delta") or {}
    calling = False
    for call in delta.get("tool_calls") or []:
        gathered = calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
        function = call.get("function") or {}
        gathered["id"] = call.get("id") or gathered["id"]
        gathered["name"] += function.get("name") or ""
        gathered["arguments"] += function.get("arguments") or ""
        calling = calling or bool(function.get("name") or function.get("arguments"))
    return delta.get("content") or "", calling


def _count(event: dict[str, Any]) -> int | None:
    timings = event.get("timings") or {}
    if isinstance(timings.get("predicted_n"), int):
        return timings["predicted_n"]
    usage = event.get("usage") or {}
    return usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None


def _ended_at_eog(path: str, event: dict[str, Any], body: dict[str, Any]) -> bool:
    """Whether this event ends an answer at the model's end-of-generation token (not a limit, not a stop
    string): llama-server's `stop_type` "eos", or OpenAI's `finish_reason` "stop" (or "tool_calls") where
    the request asked for no stop strings."""
    if path == "/infill":
        return event.get("stop_type") == "eos"
    reason = (event.get("choices") or [{}])[0].get("finish_reason")
    return reason in ("stop", "tool_calls") and not body.get("stop")


def _prompt_ms(event: dict[str, Any]) -> float | None:
    value = (event.get("timings") or {}).get("prompt_ms")
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def _prompt_count(event: dict[str, Any]) -> int | None:
    timings = event.get("timings") or {}
    cached, evaluated = timings.get("cache_n"), timings.get("prompt_n")
    if isinstance(evaluated, int) and evaluated >= 0:
        return evaluated + (cached if isinstance(cached, int) and cached > 0 else 0)
    return None


@dataclass(frozen=True)
class Comparison:
    """A greedy answer against the reference's: equal, one a prefix of the other, or where they part."""

    # "equal"; "call": the same tool call, one server returning it as a call and the other as the JSON text the
    # model wrote (llama-server leaves a bare or ```json-fenced call in the content); "prefix", "differs",
    # "error", "reference"
    kind: str
    position: int | None = None  # the first character that differs
    history_differs: bool = False

    def label(self) -> str:
        text = {"equal": "=", "call": "= as a call", "prefix": "prefix", "reference": "(ref)", "error": "error"}.get(
            self.kind
        )
        text = text or f"differs at char {self.position}"
        return text + (" (own history)" if self.history_differs else "")


def compare(answer: Reply, reference: Reply) -> Comparison:
    if answer.error or reference.error:
        return Comparison("error")
    a, b = answer.text, reference.text
    if a == b:
        return Comparison("equal")
    call = _as_call(b)
    if call is not None and _as_call(a) == call:
        return Comparison("call")
    position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return Comparison("prefix" if position == min(len(a), len(b)) else "differs", position)


def _as_call(text: str) -> str | None:
    """A whole answer that is one tool call, as `Reply.text` shows a call (name(arguments), canonical JSON):
    the call a server parsed, or the JSON object {"name": ..., "arguments": {...}} the model wrote as text,
    bare or in a ```json fence. None: the answer is not one call."""
    shown = re.fullmatch(r"\s*([\w.-]+)\((\{.*\})\)\s*", text, re.DOTALL)
    if shown:
        return f"{shown.group(1)}({_canonical(shown.group(2))})"
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", text, re.DOTALL)
    try:
        call = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return None
    if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["name"], str):
        return None
    arguments = call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"])
    return f"{call['name']}({_canonical(arguments)})"


@dataclass
class Row:
    index: int
    request: TraceRequest
    replies: dict[str, Reply]
    comparisons: dict[str, Comparison]


def replay(
    trace: Trace,
    servers: list[Running],
    *,
    greedy: bool = True,
    honour_gaps: bool = False,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Every request to every server in turn (the first server is the reference); one row a request."""
    transcripts = {server.name: Transcript() for server in servers}
    reference = servers[0].name
    rows = []
    with httpx.Client() as client:
        for index, request in enumerate(trace.requests, start=1):
            if honour_gaps and index > 1:
                time.sleep(request.gap_s)
            replies: dict[str, Reply] = {}
            for server in servers:
                transcript = transcripts[server.name]
                body = prepared_body(request, transcript, greedy=greedy)
                try:
                    reply = send(client, server.base_url, request.path, body, counts_eog=server.counts_eog)
                except (httpx.HTTPError, ValueError) as error:
                    if server.process.poll() is not None:
                        raise SpecggufError(f"{server.name} died; its log ends: {log_tail(server)}") from None
                    reply = Reply("", None, 0.0, 0, error=f"{type(error).__name__}: {error}"[:300])
                replies[server.name] = reply
                if request.path == CHAT and reply.message is not None:
                    transcript.messages.append(reply.message)
            comparisons = {reference: Comparison("reference")}
            for name, reply in replies.items():
                if name != reference:
                    result = compare(reply, replies[reference])
                    history = request.replay_history and transcripts[name].diverged
                    comparisons[name] = Comparison(result.kind, result.position, history)
                    transcripts[name].diverged |= result.kind != "equal"
            row = Row(index, request, replies, comparisons)
            on_row(row)
            rows.append(row)
    return rows
