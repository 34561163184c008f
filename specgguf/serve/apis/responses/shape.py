"""The Responses API's bodies out: the response object (whole, or as the stream's created /
in_progress / completed snapshots), its output items (a message with its text, a function_call per
call) and the stream's semantic events, numbered."""

from __future__ import annotations

import json
import secrets
import time

from ....conversation import ToolCall
from ...generator import Finished
from .bodies import ResponsesBody


def call_item_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


class Shape:
    def __init__(self, body: ResponsesBody, model: str):
        self.body, self.model = body, body.model or model
        self.id, self.item_id = "resp_" + secrets.token_hex(12), "msg_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.sequence = 0

    def part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, text: str, *, done: bool) -> dict:
        return {
            "id": self.item_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [self.part(text)] if done else [],
        }

    def call_item(self, call: ToolCall, *, done: bool, cut: bool = False) -> dict:
        """A call's item; `cut`: its arguments were cut short by max_output_tokens ("incomplete")."""
        return {
            "id": call_item_id(call.id),
            "type": "function_call",
            "status": "incomplete" if cut else "completed" if done else "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments if done else "",
        }

    def output(self, text: str, calls: list[ToolCall], *, cut: bool = False) -> list[dict]:
        """The answer's items: its message (none when only blank text comes before calls), its calls
        (`cut`: the answer was, and its last call with it)."""
        message = [self.item(text, done=True)] if text.strip() or not calls else []
        last = len(calls) - 1
        return message + [self.call_item(call, done=True, cut=cut and i == last) for i, call in enumerate(calls)]

    def response(self, text: str, finished: Finished | None) -> dict:
        body = self.body
        incomplete = finished is not None and finished.finish_reason == "length"
        status = "in_progress" if finished is None else "incomplete" if incomplete else "completed"
        usage = None
        if finished is not None:
            usage = {
                "input_tokens": finished.n_prompt,
                "input_tokens_details": {"cached_tokens": finished.n_cached, "cache_write_tokens": 0},
                "output_tokens": finished.n_completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": finished.n_prompt + finished.n_completion,
            }
        tools = [
            {"type": "function", "name": tool.name, "description": tool.description, "parameters": tool.parameters,
             "strict": tool.strict if tool.strict is not None else True}
            for tool in body.tools or []
        ]  # fmt: skip
        shaped = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": [] if finished is None else self.output(text, finished.tool_calls, cut=incomplete),
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store is not False,
            "temperature": body.temperature if body.temperature is not None else 1.0,
            "text": {"format": body.format.model_dump(exclude_none=True, by_alias=True)},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": tools,
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "truncation": "disabled",
            "metadata": body.metadata or {},
        }
        return shaped | ({"usage": usage} if usage else {}) | ({"user": body.user} if body.user else {})

    def event(self, kind: str, **data) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
