"""Anthropic's Messages API through the real `anthropic` client, against a live server (tiny pair)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from live_server import live_server

HELLO = [{"role": "user", "content": "hello the cat"}]
GREEDY = {"temperature": 0}  # older clients' sampling fields (the current SDK no longer has them)


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    args = ("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-k", "3")
    with live_server(*args, api_key="s3cret") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="s3cret", max_retries=0)


def test_a_message_whole_and_streamed(client, server):
    message = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=12, messages=HELLO, system="Be brief.", extra_body=GREEDY
    )
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and 1 <= message.usage.output_tokens <= 12
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=12, messages=HELLO, system="Be brief.", extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text == final.content[0].text
    assert final.stop_reason == message.stop_reason and final.usage.output_tokens == message.usage.output_tokens
    # The same answer as the OpenAI endpoint gives.
    openai_answer = server.client().chat.completions.create(
        model="x",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        max_tokens=12,
        temperature=0,
        extra_body={"speculative": {"k": 3}},
    )
    assert openai_answer.choices[0].message.content == text


def test_stop_sequences_and_a_conversation(client):
    first = client.messages.create(model="m", max_tokens=16, messages=HELLO, extra_body=GREEDY)
    word = first.content[0].text.split()[1] if len(first.content[0].text.split()) > 1 else None
    if word:
        stopped = client.messages.create(
            model="m", max_tokens=16, messages=HELLO, extra_body=GREEDY, stop_sequences=[word]
        )
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
        assert word not in stopped.content[0].text
    history = [*HELLO, {"role": "assistant", "content": first.content}, {"role": "user", "content": "and the dog?"}]
    second = client.messages.create(model="m", max_tokens=8, messages=history, extra_body=GREEDY)
    assert second.usage.cache_read_input_tokens > 0  # the first turn came from the cache


def test_count_tokens(client):
    counted = client.messages.count_tokens(model="m", messages=HELLO, system="Be brief.")
    answered = client.messages.create(model="m", max_tokens=1, messages=HELLO, system="Be brief.")
    assert counted.input_tokens == answered.usage.input_tokens + answered.usage.cache_read_input_tokens


def test_errors_are_anthropics_shape(client, server):
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="m", max_tokens=4, messages=HELLO, tools=[{"type": "web_search_20250305", "name": "web_search"}]
        )
    assert "tools[0].type" in str(refused.value)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=4, messages=HELLO
        )
    for body in ({}, {"model": "m", "max_tokens": 4, "messages": "hi"}, {"model": "m", "messages": HELLO}):
        response = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": "s3cret"})
        assert response.status_code == 400 and response.json()["type"] == "error", response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    image = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=4, messages=image)
    assert client.messages.create(model="m", max_tokens=2, messages=HELLO).content
