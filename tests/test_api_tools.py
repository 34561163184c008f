"""Tools and structured output in the APIs beside chat completions — Anthropic's /v1/messages,
OpenAI's /v1/responses, Ollama's /api/chat — through their real client libraries against a live
server on the tiny GGUF pair (whose vocabulary has no `<tool_call>` token: a call is the grammar's
from the start when the choice asks for one). Each: a call, its result sent back, an answer; a
structured answer that parses and follows its schema; whole and streamed alike."""

from __future__ import annotations

import json
import re
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
    # {"type": "none"}: the prompt is the one without the tools (counted so too), so is the answer.
    counted = claude.messages.count_tokens(
        model="m", messages=history, tools=CLAUDE_TOOLS, tool_choice={"type": "none"}
    )
    assert counted.input_tokens == after.usage.input_tokens + after.usage.cache_read_input_tokens
    assert counted.input_tokens == claude.messages.count_tokens(model="m", messages=history).input_tokens
    plain = claude.messages.create(model="m", max_tokens=8, messages=history, extra_body=GREEDY)
    assert [b.text for b in after.content] == [b.text for b in plain.content]


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


# --- Ollama ---


@pytest.fixture(scope="module")
def ollama_client(server):
    import ollama

    return ollama.Client(host=server.base_url)


OLLAMA_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER_SCHEMA},
    }
]


def test_ollama_format_json_and_a_schema_whole_and_streamed(ollama_client):
    messages = [{"role": "user", "content": "the cat"}]
    for temperature in (0, 0.8):
        options = {"temperature": temperature, "num_predict": 300}
        whole = ollama_client.chat(model="m", messages=messages, format=PET_SCHEMA, options=options)
        jsonschema.validate(json.loads(whole.message.content), PET_SCHEMA)
        parts = list(ollama_client.chat(model="m", messages=messages, format=PET_SCHEMA, options=options, stream=True))
        jsonschema.validate(json.loads("".join(part.message.content for part in parts)), PET_SCHEMA)
    # "json": any object (a random model may not close it in 40 tokens; the first key comes after its whitespace).
    anything = ollama_client.chat(model="m", messages=messages, format="json", options={"num_predict": 40})
    assert re.match(r'\{\s*["}]', anything.message.content)
    generated = ollama_client.generate(model="m", prompt="the dog", format=PET_SCHEMA, options={"num_predict": 300})
    jsonschema.validate(json.loads(generated.response), PET_SCHEMA)


def test_ollama_tool_results_in_the_history_reach_the_prompt(ollama_client, server):
    openai = server.client()
    # The tiny model writes no call unasked (Ollama has no tool_choice): SmolLM2 calls at the end.
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"},
    ]
    options = {"temperature": 0, "num_predict": 6}
    answered = ollama_client.chat(model="m", messages=history, tools=OLLAMA_TOOLS, options=options)
    assert answered.done_reason in ("stop", "length") and not answered.message.tool_calls
    # The result is in the prompt: the same as the OpenAI route's for the same conversation.
    openai_history = [
        *ASK,
        {"role": "assistant", "tool_calls": [{"id": "call_1_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps(call["function"]["arguments"])}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny, 21 C"},
    ]  # fmt: skip
    same = openai.chat.completions.create(
        model="m", messages=openai_history, tools=OLLAMA_TOOLS, max_tokens=6, temperature=0
    )
    assert answered.prompt_eval_count == same.usage.prompt_tokens > len(ASK[0]["content"].split())
    assert answered.message.content == same.choices[0].message.content


def test_ollama_shapes_calls_and_matches_results_to_them():
    from specgguf.conversation import ToolCall
    from specgguf.serve.apis.ollama.chat import OllamaMessage, history, tool_calls

    shaped = tool_calls([ToolCall("call_1", "get_weather", '{"city": "Paris"}'), ToolCall("call_2", "add", '{"a": ')])
    assert shaped == [{"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    calls = [{"function": {"name": name, "arguments": {}}} for name in ("a", "b")]
    turns = history(
        [
            OllamaMessage(role="assistant", tool_calls=calls),
            OllamaMessage(role="tool", content="B", tool_name="b"),
            OllamaMessage(role="tool", content="A"),
        ]
    )
    assert [call.id for call in turns[0].tool_calls] == ["call_0_0", "call_0_1"]
    assert [(turn.content, turn.tool_call_id) for turn in turns[1:]] == [("B", "call_0_1"), ("A", "call_0_0")]


def test_ollama_bad_tools_and_formats_are_ollamas_errors(server):
    ask = {"model": "m", "messages": ASK, "stream": False}
    bad = [
        ({"format": {"type": "nonsense"}}, "'format'"),
        ({"tools": OLLAMA_TOOLS, "format": "json"}, "cannot be combined with 'format'"),
        ({"tools": [*OLLAMA_TOOLS, *OLLAMA_TOOLS]}, "two tools are named"),
        (
            {"tools": OLLAMA_TOOLS, "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "fly"}}]}]},
            "unknown tool 'fly'",
        ),
    ]
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for fields, message in bad:
            refused = http.post("/api/chat", json={**ask, **fields})
            assert refused.status_code == 400 and message in refused.json()["error"], fields


# --- OpenAI's Responses API ---

RESPONSES_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER_SCHEMA}
]


def test_responses_function_call_round_trip_whole_and_streamed(server):
    client = server.client()
    asked: dict[str, Any] = {
        "model": "m",
        "input": ASK[0]["content"],
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    response = client.responses.create(**asked)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    assert response.status == "completed" and response.tools[0].name == "get_weather"
    events = list(client.responses.create(**asked, stream=True))
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    added = [event.item for event in events if event.type == "response.output_item.added"]
    assert [item.type for item in added] == ["function_call"] and added[0].name == "get_weather"
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments == events[-1].response.output[-1].arguments
    assert [event.sequence_number for event in events] == list(range(len(events)))
    # The result back, as input items (the call as the response gave it) and by previous_response_id.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    items = [ASK[0], call.model_dump(exclude_none=True), result]
    after = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, max_output_tokens=6, temperature=0)
    assert [item.type for item in after.output] == ["message"] and after.output_text
    # tool_choice "none" after the call: a plain answer, its prompt the one without the tools.
    plain = client.responses.create(model="m", input=items, max_output_tokens=6, temperature=0)
    chained = client.responses.create(
        model="m",
        input=[result],
        previous_response_id=response.id,
        tools=RESPONSES_TOOLS,
        tool_choice="none",
        max_output_tokens=6,
        temperature=0,
    )
    assert [item.type for item in chained.output] == ["message"]
    assert chained.output_text == plain.output_text
    assert chained.usage.input_tokens == plain.usage.input_tokens


def test_responses_bodies_with_tools_follow_openais_schema(server):
    from openai_schema import assert_conforms

    body = {"input": "the weather", "tools": RESPONSES_TOOLS, "tool_choice": "required", "temperature": 0}
    with server.http() as http:
        raw = http.post("/v1/responses", json=body).json()
        assert_conforms(raw, "Response")
        fmt = {"type": "json_schema", "name": "pets", "schema": PET_SCHEMA, "strict": True}
        assert_conforms(
            http.post("/v1/responses", json={"input": "the cat", "text": {"format": fmt}}).json(), "Response"
        )


def test_responses_text_format_whole_and_streamed(server):
    client = server.client()
    fmt = {"type": "json_schema", "name": "pets", "schema": PET_SCHEMA, "strict": True}
    for temperature in (0, 0.8):
        response = client.responses.create(model="m", input="the cat", text={"format": fmt}, temperature=temperature)
        assert response.status == "completed" and response.text.format.type == "json_schema"
        jsonschema.validate(json.loads(response.output_text), PET_SCHEMA)
        events = client.responses.create(
            model="m", input="the cat", text={"format": fmt}, temperature=temperature, stream=True
        )
        text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
        jsonschema.validate(json.loads(text), PET_SCHEMA)
    anything = client.responses.create(
        model="m", input="the cat", text={"format": {"type": "json_object"}}, max_output_tokens=40
    )
    assert re.match(r'\{\s*["}]', anything.output_text)


def test_a_call_cut_by_max_tokens_is_kept_as_cut_whole_and_streamed(claude, server):
    # 60 tokens: the tiny model is inside the call's arguments (tests/test_serve_tools.py's case).
    asked = {"model": "m", "max_tokens": 60, "messages": ASK, "tools": CLAUDE_TOOLS, "tool_choice": ANY_ONE}
    message = claude.messages.create(**asked, extra_body=GREEDY)
    with claude.messages.stream(**asked, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert message.stop_reason == final.stop_reason == "max_tokens"
    assert [(b.type, b.name, b.input) for b in message.content] == [(b.type, b.name, b.input) for b in final.content]
    assert [b.type for b in message.content] == ["tool_use"]
    # Cut before the call's name (16 tokens): no block, and never the call's markup as text (issue 48).
    cut = {**asked, "max_tokens": 16}
    early = claude.messages.create(**cut, extra_body=GREEDY)
    with claude.messages.stream(**cut, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    for shown in (early, streamed):
        assert shown.stop_reason == "max_tokens"
        # (the tiny SPM vocabulary spells the opener with a space in front, which comes as text)
        assert not [b for b in shown.content if b.type == "tool_use" or (b.type == "text" and b.text.strip())]
    client = server.client()
    asked_responses: dict[str, Any] = {
        "model": "m",
        "input": ASK[0]["content"],
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "max_output_tokens": 60,
        "temperature": 0,
    }
    response = client.responses.create(**asked_responses)
    events = list(client.responses.create(**asked_responses, stream=True))
    assert response.status == events[-1].response.status == "incomplete"
    (call,) = response.output
    assert call.type == "function_call" and call.status == "incomplete"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.arguments)
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [(item.status, item.arguments) for item in done] == [("incomplete", call.arguments)]


# --- tool_choice "none", on a GGUF without a chat template (ChatML, Hermes' tool prompt: tools show) ---


@pytest.fixture(scope="module")
def chatml_server(tmp_path_factory):
    from tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path_factory.mktemp("chatml") / "plain.gguf", base_seed=7, chat_template=None)
    with live_server("-m", model, "-c", "2048", "-t", "1", "-n", "8", "-k", "0") as live:
        yield live


def test_tool_choice_none_renders_the_prompt_without_the_tools(chatml_server):
    # As a client asking for an answer expects: the model is not shown tools it may not call, so it
    # does not write a call as text; nothing is parsed into calls.
    client, tools = chatml_server.client(), [{"type": "function", "function": {"name": "get_weather"}}]
    asked: dict[str, Any] = {"model": "m", "messages": ASK, "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**asked)
    shown = client.chat.completions.create(**asked, tools=tools)
    none = client.chat.completions.create(**asked, tools=tools, tool_choice="none")
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < shown.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            **asked, tools=tools, tool_choice="none", stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    claude = anthropic.Anthropic(base_url=chatml_server.base_url, api_key="unused", max_retries=0)
    claude_tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    counted = {
        choice: claude.messages.count_tokens(model="m", messages=ASK, tools=claude_tools, tool_choice={"type": choice})
        for choice in ("auto", "none")
    }
    assert counted["none"].input_tokens == claude.messages.count_tokens(model="m", messages=ASK).input_tokens
    assert counted["none"].input_tokens < counted["auto"].input_tokens
    answer = claude.messages.create(
        model="m", max_tokens=8, messages=ASK, tools=claude_tools, tool_choice={"type": "none"}, extra_body=GREEDY
    )
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == counted["none"].input_tokens
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content[0].text == plain.choices[0].message.content


# --- Ollama, with a model that calls: SmolLM2-135M-Instruct, shown one call in the history ---

ONE_SHOT = [
    {"role": "system", "content": "You call tools by writing <tool_call> and the call as JSON."},
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    },
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny in Rome."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
CITY_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(scope="module")
def smol_server(smollm2):
    with live_server("-m", smollm2, "-c", "2048", "-t", "1", "-n", "80") as live:
        yield live


def test_ollama_tool_call_round_trip_whole_and_streamed(smol_server):
    import ollama

    client, greedy = ollama.Client(host=smol_server.base_url), {"temperature": 0}
    whole = client.chat(model="m", messages=ONE_SHOT, tools=CITY_TOOLS, options=greedy)
    assert whole.done_reason == "stop" and whole.message.content == ""
    ((call),) = whole.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    parts = list(client.chat(model="m", messages=ONE_SHOT, tools=CITY_TOOLS, options=greedy, stream=True))
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    streamed = [c for part in parts for c in part.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [("get_weather", {"city": "Paris"})]
    # The call and its result back in the history; the model answers in text.
    history = [
        *ONE_SHOT,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "content": "rainy, 12 C", "tool_name": "get_weather"},
    ]
    answer = client.chat(model="m", messages=history, tools=CITY_TOOLS, options=greedy)
    assert answer.message.content and not answer.message.tool_calls
