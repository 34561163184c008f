"""Tool calling through the server with the real openai SDK, on the tiny GGUF pair (whose vocabulary has no
`<tool_call>` token: a call is the grammar's from the start when tool_choice asks for one; a random model,
it spends many tokens on the whitespace the call's grammar allows) — the live tests with the default pair
(test_agents_live.py) see the model choose."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from live_server import live_server

MODEL = "verifier"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
ADD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (WEATHER, ADD)}


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "-t", "1", "-n", "400") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _ask(client, messages=None, **options):
    options.setdefault("extra_body", {"speculative": {"k": 3}})
    messages = messages or [{"role": "user", "content": "the weather in the city"}]
    return client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, ADD], **options)


def _check(call):
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_required_tool_calls_parse_and_validate(client, temperature):
    for seed in range(3):
        response = _ask(client, tool_choice="required", temperature=temperature, seed=seed, parallel_tool_calls=False)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            _check(call)
        # Every token of the answer counts, the call's too (the opener is no stop string).
        assert response.usage.completion_tokens == response.model_extra["timings"]["predicted_n"]


def test_a_call_cut_by_max_tokens_ends_as_length(client):
    options = {"tool_choice": "required", "temperature": 0, "parallel_tool_calls": False}
    for max_tokens in (16, 60):  # cut before the call's name, and inside its arguments
        choice = _ask(client, max_tokens=max_tokens, **options).choices[0]
        assert choice.finish_reason == "length"
        # Never the call's markup (issue 48: cut before its name); the tiny SPM vocabulary spells the
        # opener with a space in front, which comes as content.
        assert not (choice.message.content or "").strip()
        whole = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]
        finish, streamed, content = [], {}, ""
        for chunk in _ask(client, max_tokens=max_tokens, stream=True, **options):
            finish += [chunk.choices[0].finish_reason] if chunk.choices else []
            content += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = streamed.setdefault(delta.index, [delta.function.name, ""])
                entry[1] += delta.function.arguments or ""
        assert [reason for reason in finish if reason] == ["length"] and not content.strip()
        assert [tuple(entry) for entry in streamed.values()] == whole
        if max_tokens == 16:
            assert whole == []  # cut before its name: no call to report
    # At 60 tokens the name has come, not all the arguments: OpenAI's "length" with the arguments so far.
    ((name, arguments),) = whole
    assert name in SCHEMAS and arguments.lstrip().startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)


def test_a_named_function_is_the_one_called(client):
    response = _ask(client, tool_choice={"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False)
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "add"
    _check(call)
    assert response.model_extra["timings"]["draft_n_accepted_by_source"].get("grammar", 0) > 0


def test_streamed_tool_calls_rebuild_the_whole_answers_calls(client):
    # One call: a parallel one the tiny model may leave unfinished at max_tokens (streamed in part).
    options = {"tool_choice": "required", "temperature": 0.7, "seed": 3, "parallel_tool_calls": False}
    whole = _ask(client, **options).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = []
    for chunk in _ask(client, stream=True, **options):
        if not chunk.choices:
            continue
        finish.append(chunk.choices[0].finish_reason)
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            entry["arguments"] += delta.function.arguments or ""
    assert [finish_reason for finish_reason in finish if finish_reason] == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (call.function.name, call.function.arguments) for call in whole
    ]


def test_a_conversation_with_tool_results_goes_on(client):
    first = _ask(client, tool_choice="required", temperature=0).choices[0].message
    history = [
        {"role": "user", "content": "the weather in the city"},
        first.model_dump(exclude_none=True),
        *[{"role": "tool", "tool_call_id": call.id, "content": "sunny"} for call in first.tool_calls],
    ]
    answer = _ask(client, history, tool_choice="none", max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.tool_calls is None
    # "none": the prompt is rendered without the tools (as if none were given), whole and streamed.
    plain = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=8, temperature=0, extra_body={"speculative": {"k": 3}}
    )
    assert answer.usage.prompt_tokens == plain.usage.prompt_tokens
    assert answer.choices[0].message.content == plain.choices[0].message.content
    streamed = _ask(
        client,
        history,
        tool_choice="none",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert not any(chunk.choices and chunk.choices[0].delta.tool_calls for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def _bad(tools=None, **fields):
    return {"tools": tools if tools is not None else [WEATHER], **fields}


def _deep(depth):
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _tool(parameters, name="broken"):
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize(
    "body, param, message",
    [
        (_bad([_tool({"type": "nonsense"})]), "tools[0].function.parameters", "is not valid"),
        (_bad([_tool([1, 2])]), "tools[0].function.parameters", "should be an object"),
        (_bad([_tool(_deep(40))]), "tools[0].function.parameters", "deeper than 32"),
        (_bad([_tool({}, name="bad name!")]), "tools[0].function.name", "pattern"),
        (_bad([WEATHER, WEATHER]), "tools", "two tools are named 'get_weather'"),
        (_bad(tool_choice={"type": "function", "function": {"name": "fly"}}), "tool_choice", "'fly', which is not in"),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        (
            _bad(
                messages=[
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "fly", "arguments": "{}"}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "done"},
                ]
            ),
            "messages[1].tool_calls[0].function.name",
            "unknown tool 'fly'",
        ),
        (_bad(messages=[{"role": "tool", "content": "42"}]), "messages[0].tool_call_id", "is missing"),
        (
            _bad(messages=[{"role": "tool", "tool_call_id": "x", "content": "42"}]),
            "messages[0].tool_call_id",
            "no earlier",
        ),
        (_bad(response_format={"type": "json_object"}), "tools", "cannot be combined"),
    ],
    ids=[
        "bad-schema",
        "schema-not-object",
        "too-deep",
        "bad-name",
        "duplicate",
        "unknown-choice",
        "choice-no-tools",
        "unknown-call",
        "tool-no-id",
        "tool-unasked",
        "with-format",
    ],
)
def test_bad_tools_are_400s_naming_the_problem(server, body, param, message):
    body = {"messages": [{"role": "user", "content": "hi"}], **body}
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error
