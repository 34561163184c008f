"""OpenAI's response shapes (chat and text completions, whole or as stream chunks), built from the
worker's `Finished` message, with llama-server's `timings` (common.py)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Literal

from ....conversation import ToolCall
from ...common import timings, usage
from ...draft_marks import Span
from ...generator import Finished
from ...text import TokenLogprob
from ...tools import CallDelta

# OpenAI's backend configuration id (a string in its schema): the server and its version.
SYSTEM_FINGERPRINT = "fp_specgguf_0.1"


class Shape:
    """One response's id and envelope; `kind` "chat" (/v1/chat/completions) or "text" (/v1/completions)."""

    def __init__(self, kind: Literal["chat", "text"], model: str, *, logprobs: bool = False, marks: bool = False):
        self.kind, self.model, self.logprobs = kind, model, logprobs
        self.marks = marks  # chunks carry `specgguf`: spans by writer, and the whole stats at the end
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self._text_offset = 0  # where the next token starts in the text (the legacy logprobs' text_offset)

    def _logprobs(self, entries: list[TokenLogprob]) -> dict | None:
        """OpenAI's two shapes: chat's list of token objects, the legacy completions' parallel lists."""
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {
                "content": [
                    {
                        **_token(entry.token, entry.logprob),
                        "top_logprobs": [_token(token, logprob) for token, logprob in entry.top],
                    }
                    for entry in entries
                ],
                "refusal": None,
            }
        offsets = []
        for entry in entries:
            offsets.append(self._text_offset)
            self._text_offset += len(_text(entry.token))
        return {
            "tokens": [_text(entry.token) for entry in entries],
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [{_text(token): logprob for token, logprob in entry.top} for entry in entries],
            "text_offset": offsets,
        }

    def _envelope(self, *, chunk: bool, choices: list[dict]) -> dict:
        if self.kind == "chat":
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }

    def _choice(
        self,
        text: str | None,
        finish_reason: str | None,
        *,
        chunk: bool,
        role: bool = False,
        logprobs: list[TokenLogprob] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        shaped = self._logprobs(logprobs) if logprobs is not None else None
        if self.kind == "text":
            return {"index": 0, "text": text or "", "logprobs": shaped, "finish_reason": finish_reason}
        if not chunk:
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
            if tool_calls:  # OpenAI's content beside calls: null unless the model wrote text first
                message.update(content=text if text and text.strip() else None, tool_calls=tool_calls)
            return {"index": 0, "message": message, "logprobs": shaped, "finish_reason": finish_reason}
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        delta |= ({} if text is None else {"content": text}) | ({"tool_calls": tool_calls} if tool_calls else {})
        return {"index": 0, "delta": delta, "logprobs": shaped, "finish_reason": finish_reason}

    def response(self, text: str, finished: Finished, logprobs: list[TokenLogprob]) -> dict:
        calls = [_call(call) for call in finished.tool_calls]
        choice = self._choice(text, finished.finish_reason, chunk=False, logprobs=logprobs, tool_calls=calls)
        return {**self._envelope(chunk=False, choices=[choice]), "usage": usage(finished), "timings": timings(finished)}

    def _chunk(self, choices: list[dict], include_usage: bool) -> dict:
        body = self._envelope(chunk=True, choices=choices)
        return {**body, "usage": None} if include_usage else body

    def first_chunk(self, include_usage: bool) -> dict:
        """Chat streams open with the assistant's role (OpenAI does); text streams with empty text."""
        return self._marked(self._chunk([self._choice("", None, chunk=True, role=True)], include_usage), [])

    def chunk(
        self,
        text: str,
        logprobs: list[TokenLogprob],
        include_usage: bool,
        tool_calls: list[CallDelta] | None = None,
        spans: list[Span] | None = None,
    ) -> dict:
        shown = None if tool_calls and not text else text
        deltas = [_call_delta(delta) for delta in tool_calls or []]
        body = self._chunk([self._choice(shown, None, chunk=True, logprobs=logprobs, tool_calls=deltas)], include_usage)
        return self._marked(body, spans or [])

    def last_chunk(self, finished: Finished, include_usage: bool) -> dict:
        """The finish reason, with llama-server's `timings` (its streams carry them on the last chunk)."""
        body = {
            **self._chunk([self._choice(None, finished.finish_reason, chunk=True)], include_usage),
            "timings": timings(finished),
        }
        return self._marked(body, [], stats=finished.stats.as_dict())

    def _marked(self, body: dict, spans: list[Span], **more) -> dict:
        """`mark_drafts`: specgguf's own object beside OpenAI's fields, on every chunk with a choice."""
        shaped = [{"text": span.text, "source": span.source} for span in spans]
        return {**body, "specgguf": {"spans": shaped, **more}} if self.marks else body

    def usage_chunk(self, finished: Finished) -> dict:
        """`stream_options.include_usage`: one more chunk, with no choices and the usage."""
        return {**self._envelope(chunk=True, choices=[]), "usage": usage(finished)}

    @staticmethod
    def sse(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def _token(token: bytes, logprob: float) -> dict:
    return {"token": _text(token), "logprob": logprob, "bytes": list(token)}


def _call(call: ToolCall) -> dict:
    """A whole call, as `message.tool_calls` lists it."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _call_delta(delta: CallDelta) -> dict:
    """A piece of a call, as `delta.tool_calls` streams it: index, id and name first, then arguments."""
    if delta.id is not None:
        function = {"name": delta.name, "arguments": delta.arguments}
        return {"index": delta.index, "id": delta.id, "type": "function", "function": function}
    return {"index": delta.index, "function": {"arguments": delta.arguments}}
