"""Tools and structured output in the APIs beside chat completions — Anthropic's /v1/messages,
OpenAI's /v1/responses, Ollama's /api/chat — through their real client libraries against a live
server on the tiny GGUF pair (whose vocabulary has no `<tool_call>` token: a call is the grammar's
from the start when the choice asks for one). Each: a call, its result sent back, an answer; a
structured answer that parses and follows its schema; whole and streamed alike."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest

from live_server import live_server

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}
PET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"word": {"enum": ["cat", "dog", "sea"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["word", "count"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "the weather in the city"}]


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    # -k 3: a fixed K, so greedy answers repeat whole and streamed; -n 300: a random model spends
    # many tokens on the whitespace JSON allows.
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "-t", "1", "-n", "300", "-k", "3") as live:
        yield live


# --- Anthropic ---


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


CLAUDE_TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER_SCHEMA}]
ANY_ONE = {"type": "any", "disable_parallel_tool_use": True}
GREEDY = {"temperature": 0}  # the current SDK no longer has the sampling fields


def test_anthropic_tool_use_round_trip_whole_and_streamed(claude):
    asked = {"model": "m", "max_tokens": 300, "messages": ASK, "tools": CLAUDE_TOOLS, "tool_choice": ANY_ONE}
    message = claude.messages.create(**asked, extra_body=GREEDY)
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    with claude.messages.stream(**asked, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [event.content_block for event in events if event.type == "content_block_start"]
    assert [block.type for block in starts] == ["tool_use"] and starts[0].name == "get_weather"
    partial = "".join(
        event.delta.partial_json
        for event in events
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == use.input
    assert final.stop_reason == "tool_use" and final.content[-1].input == use.input
    # The first event reports the prompt's real size (the same as the final usage; here cached, as asked before).
    first, n_prompt = events[0], final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert first.type == "message_start" and n_prompt > 10
    assert first.message.usage.input_tokens + first.message.usage.cache_read_input_tokens == n_prompt
    # The result goes back as a tool_result block; the model answers in text.
    history = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]},
    ]
    after = claude.messages.create(
        model="m", max_tokens=8, messages=history, tools=CLAUDE_TOOLS, tool_choice={"type": "none"}, extra_body=GREEDY
    )
    assert after.stop_reason in ("end_turn", "max_tokens") and [b.type for b in after.content] == ["text"]
    counted = claude.messages.count_tokens(model="m", messages=history, tools=CLAUDE_TOOLS)
    assert counted.input_tokens == after.usage.input_tokens + after.usage.cache_read_input_tokens


def test_anthropic_structured_output_whole_and_streamed(claude):
    asked: dict[str, Any] = {"model": "m", "max_tokens": 300, "messages": [{"role": "user", "content": "the cat"}]}
    shape = {"output_config": {"format": {"type": "json_schema", "schema": PET_SCHEMA}}}
    for temperature in (0, 0.8):
        message = claude.messages.create(**asked, extra_body={**shape, "temperature": temperature})
        assert message.stop_reason == "end_turn"
        jsonschema.validate(json.loads(message.content[0].text), PET_SCHEMA)
    with claude.messages.stream(**asked, extra_body={**shape, "temperature": 0.8}) as stream:
        text = "".join(stream.text_stream)
    jsonschema.validate(json.loads(text), PET_SCHEMA)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "client tools only"),
        ({"tools": [{"name": "bad name!", "input_schema": {}}]}, "is not a function name"),
        ({"tools": CLAUDE_TOOLS, "tool_choice": {"type": "tool", "name": "fly"}}, "'fly', which is not in"),
        (
            {"tools": [{"name": "x", "input_schema": {"type": "nonsense"}}]},
            "is not valid: Invalid type: nonsense (tool 'x')",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}]},
            "no earlier assistant message",
        ),
        (
            {"tools": CLAUDE_TOOLS, "output_config": {"format": {"type": "json_schema", "schema": PET_SCHEMA}}},
            "cannot be combined",
        ),
    ],
    ids=["server-tool", "bad-name", "unknown-choice", "bad-schema", "orphan-result", "tools-and-format"],
)
def test_anthropic_bad_tools_are_400s_naming_the_problem(server, fields, message):
    body = {"model": "m", "max_tokens": 4, "messages": ASK, **fields}
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        refused = http.post("/v1/messages", json=body)
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert message in refused.json()["error"]["message"]
