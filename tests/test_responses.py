"""OpenAI's Responses API through the openai SDK (and the OpenAI Agents SDK's default model),
against a live server (tiny pair); bodies and stream events checked against OpenAI's schemas."""

from __future__ import annotations

import json

import openai
import pytest

from live_server import live_server
from openai_schema import assert_conforms

EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
}


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-n", "12", "-k", "3") as live:
        yield live


def test_text_in_and_out_with_instructions(server):
    client = server.client()
    response = client.responses.create(model="gpt-5", input="hello the cat", instructions="Be brief.", temperature=0)
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output_text and response.usage.output_tokens >= 1
    with server.http() as http:
        raw = http.post("/v1/responses", json={"input": "hello the cat", "instructions": "Be brief.", "temperature": 0})
    assert_conforms(raw.json(), "Response")
    assert raw.json()["output"][0]["content"][0]["text"] == response.output_text


def test_streamed_semantic_events(server):
    client = server.client()
    whole = client.responses.create(model="m", input="the dog", temperature=0, max_output_tokens=8)
    events = list(client.responses.create(model="m", input="the dog", temperature=0, max_output_tokens=8, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == whole.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))
    with server.http() as http, http.stream("POST", "/v1/responses", json={"input": "the dog", "stream": True}) as raw:
        lines = [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: ")]
    for event in lines:
        assert_conforms(event, EVENT_SCHEMAS[event["type"]])


def test_previous_response_id_continues_the_conversation(server):
    client = server.client()
    first = client.responses.create(model="m", input="hello the cat", temperature=0, max_output_tokens=6)
    second = client.responses.create(
        model="m", input="and the dog?", previous_response_id=first.id, temperature=0, max_output_tokens=6
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens  # the first turn reused
    with pytest.raises(openai.BadRequestError, match="previous_response_id|not found"):
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")
    unstored = client.responses.create(model="m", input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="y", previous_response_id=unstored.id)


def test_input_items_and_refusals(server):
    client = server.client()
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
        {"role": "user", "content": "the cat"},
    ]
    assert client.responses.create(model="m", input=items, max_output_tokens=4, store=True, metadata={"a": "b"}).output
    for bad, name in (
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "file_search_call", "id": "f"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"frobnicate": 1}, "frobnicate"),
    ):
        with server.http() as http:
            response = http.post("/v1/responses", json={"input": "x", **bad})
        assert response.status_code == 400 and response.json()["error"]["param"] == name, response.text


@pytest.mark.qwen
def test_the_agents_sdks_default_model_answers(qwen_pair):
    """A real model that ends its answer (the tiny random one runs to max_output_tokens, which the
    Agents SDK reports as an error, as it would from OpenAI): the pair's 0.5B alone, for speed."""
    agents = pytest.importorskip("agents")
    _, small = qwen_pair
    with live_server("-m", small, "-c", "1024", "-t", "2", "-n", "64") as live:
        client = openai.AsyncOpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_tracing_disabled(True)
        agent = agents.Agent(
            name="helper",
            instructions="Answer with one word.",
            model="gpt-5-mini",
            model_settings=agents.ModelSettings(temperature=0),
        )
        result = agents.Runner.run_sync(agent, "What colour is the sky on a clear day?")
    assert isinstance(result.final_output, str) and 0 < len(result.final_output.split()) <= 5
