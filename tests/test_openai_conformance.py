"""`specgguf serve` measured against OpenAI's published OpenAPI document: our bodies validate
against its schemas, every spec-valid request works or gets a 400 naming the one feature not done,
and the openai SDK's own message objects can be sent back turn after turn."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from live_server import live_server
from openai_schema import assert_conforms, errors

HELLO = [{"role": "user", "content": "hello the cat"}]
SPEC = {"k": 3}


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-n", "12") as live:
        yield live


def sse(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_chat_and_completion_bodies_follow_openais_schemas(server):
    with server.http() as http:
        whole = http.post("/v1/chat/completions", json={"messages": HELLO, "logprobs": True, "top_logprobs": 2})
        assert whole.status_code == 200
        assert_conforms(whole.json(), "CreateChatCompletionResponse")
        assert isinstance(whole.json()["system_fingerprint"], str)
        body = {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            chunks = sse(response)
        assert len(chunks) > 3
        for chunk in chunks:
            assert_conforms(chunk, "CreateChatCompletionStreamResponse")
        text = http.post("/v1/completions", json={"prompt": "the cat", "logprobs": 2})
        assert_conforms(text.json(), "CreateCompletionResponse")
        with http.stream("POST", "/v1/completions", json={"prompt": "the cat", "stream": True}) as response:
            *running, last = sse(response)
        assert_conforms(last, "CreateCompletionResponse")
        for chunk in running:  # the spec gives streams this schema too; OpenAI sends null until the end
            assert chunk["choices"][0]["finish_reason"] is None
            chunk["choices"][0]["finish_reason"] = "stop"
            assert_conforms(chunk, "CreateCompletionResponse")
        assert_conforms(http.get("/v1/models").json(), "ListModelsResponse")
        assert_conforms(http.get("/v1/models/verifier").json(), "Model")


def test_the_schema_check_catches_a_wrong_body():
    assert errors({"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": []}, "Model")
    assert any("system_fingerprint" in error for error in errors(_with_null_fingerprint(), "CreateCompletionResponse"))


def _with_null_fingerprint() -> dict:
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    return {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice],
            "system_fingerprint": None}  # fmt: skip


ACCEPTED = [
    {"store": False},
    {"store": True, "metadata": {"team": "docs"}},
    {"service_tier": "auto"},
    {"user": "user-1234"},
    {"safety_identifier": "abc"},
    {"prompt_cache_key": "session-1"},
    {"prompt_cache_retention": "in_memory"},
    {"reasoning_effort": "low"},
    {"verbosity": "low"},
    {"modalities": ["text"]},
    {"parallel_tool_calls": True},
    {"logprobs": None},
    {"stream": None},
    {"stream": False, "stream_options": None},
    {"top_p": 0},
    {"n": 1},
    {"n": None},
    {"seed": None},
    {"temperature": None},
    {"audio": None},
    {"prediction": {"type": "content", "content": "the cat"}},
    {"frequency_penalty": 0.5, "presence_penalty": -0.5},
    {"logit_bias": {"50": 5, "51": -100}},
    {"stop": None},
    {"max_completion_tokens": 4},
    {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
    {"model": "gpt-4o"},  # any name: the loaded model (--strict-model refuses)
    {"messages": [{"role": "developer", "content": "Be brief."}, *HELLO]},
    {"messages": [*HELLO, {"role": "assistant", "content": None, "refusal": "I will not."}, *HELLO]},
    {"messages": [*HELLO, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, *HELLO]},
]
REFUSED = [
    ({"n": 2}, "n"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"web_search_options": {}}, "web_search_options"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
            ]
        },
        "messages[0].content[0].type",
    ),  # fmt: skip
    ({"messages": [*HELLO, {"role": "assistant", "content": "x", "audio": {"id": "a1"}}, *HELLO]}, "messages[1].audio"),
]


@pytest.mark.parametrize("extra", ACCEPTED, ids=lambda extra: ",".join(extra))
def test_spec_valid_requests_work(server, extra):
    body = {"model": "verifier", "messages": HELLO, "max_tokens": 4, **extra}
    assert not errors(body, "CreateChatCompletionRequest"), errors(body, "CreateChatCompletionRequest")
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("extra, param", REFUSED, ids=[param for _, param in REFUSED])
def test_spec_valid_requests_not_done_get_a_400_naming_the_feature(server, extra, param):
    body = {"model": "verifier", "messages": HELLO, "max_tokens": 4, **extra}
    assert not errors(body, "CreateChatCompletionRequest")
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


COMPLETIONS_ACCEPTED = [
    {"echo": None},
    {"echo": False, "best_of": 1, "user": "u"},
    {"prompt": [5, 6, 7, 8]},
    {"prompt": [[5, 6, 7, 8]]},
    {"prompt": ["the cat"]},
    {"logprobs": None, "top_p": 0, "seed": None},
]


@pytest.mark.parametrize("extra", COMPLETIONS_ACCEPTED, ids=lambda extra: ",".join(extra))
def test_spec_valid_completion_requests_work(server, extra):
    body = {"model": "verifier", "prompt": "the cat", "max_tokens": 4, **extra}
    assert not errors(body, "CreateCompletionRequest")
    with server.http() as http:
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert_conforms(response.json(), "CreateCompletionResponse")


def test_a_token_prompt_outside_the_vocabulary_and_several_prompts_are_400s(server):
    with server.http() as http:
        for prompt, param in (([10**8], None), (["a", "b"], "prompt")):
            response = http.post("/v1/completions", json={"prompt": prompt})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_an_answer_as_the_sdk_dumps_it_is_taken_back(server):
    """Not spec-valid as a request (annotations, null tool_calls), but what SDK users send."""
    answer = {"role": "assistant", "content": "hi", "refusal": None, "annotations": [], "audio": None,
              "function_call": None, "tool_calls": None}  # fmt: skip
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"messages": [*HELLO, answer, *HELLO], "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_five_turns_sending_back_the_sdks_own_message_objects(server):
    client = server.client()
    messages: list = [{"role": "system", "content": "Answer briefly."}]
    for turn in range(5):
        messages.append({"role": "user", "content": f"question {turn}: the cat and the dog"})
        response = client.chat.completions.create(model="any-name", messages=messages, max_tokens=6, temperature=0)
        message = response.choices[0].message
        assert message.role == "assistant" and message.refusal is None and message.content
        messages.append(message)  # the SDK's ChatCompletionMessage itself, as agents do
    assert len(messages) == 11 and response.usage.prompt_tokens > 40


def test_routes_answer_without_the_v1_prefix(server):
    with server.http() as http:
        assert http.get("/models").json()["data"][0]["id"] == "verifier"
        assert http.post("/chat/completions", json={"messages": HELLO, "max_tokens": 2}).status_code == 200
        assert http.post("/completions", json={"prompt": "the cat", "max_tokens": 2}).status_code == 200


def test_logit_bias_and_penalties_reach_verifier_and_draft_alike(server):
    client = server.client()
    forced = client.completions.create(
        model="verifier",
        prompt="the cat",
        max_tokens=8,
        temperature=0,
        logprobs=0,
        logit_bias={"50": 100},
        extra_body={"speculative": {**SPEC, "drafter": "model"}},
    )  # fmt: skip
    tokens = forced.choices[0].logprobs.tokens
    assert len(tokens) == 8 and len(set(tokens)) == 1  # token 50, every time
    timings = forced.model_extra["timings"]
    assert timings["draft_n_accepted"] == timings["draft_n"] >= 4  # the draft, biased alike, proposed it too
    penalised = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "logit_bias": {"50": 4}}
    answers = {
        k: client.chat.completions.create(
            model="verifier", messages=HELLO, max_tokens=12, temperature=0, **penalised,
            extra_body={"speculative": {"k": k}},
        ).choices[0].message.content
        for k in (0, 3)
    }  # fmt: skip
    assert answers[0] == answers[3]  # greedy with penalties: speculation gives plain decoding's answer
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(model="verifier", messages=HELLO, logit_bias={"99999999": 1})


OPENAI_REFUSAL = "unknown model 'gpt-4o': this server serves 'verifier' (see GET /v1/models)"
OLLAMA_REFUSAL = "model 'gpt-4o' not found, try pulling it first"
# Every API's routes that name a model, and its one refusal under --strict-model (serve/common.check_model).
STRICT_REFUSALS = {
    "/v1/chat/completions": ({"messages": HELLO}, OPENAI_REFUSAL),
    "/v1/completions": ({"prompt": "Hi"}, OPENAI_REFUSAL),
    "/v1/responses": ({"input": "Hi"}, OPENAI_REFUSAL),
    "/v1/embeddings": ({"input": "Hi"}, OPENAI_REFUSAL),
    "/infill": ({"input_prefix": "def f(", "input_suffix": ")"}, OPENAI_REFUSAL),
    "/v1/messages": ({"max_tokens": 4, "messages": HELLO}, "model: gpt-4o"),
    "/v1/messages/count_tokens": ({"messages": HELLO}, "model: gpt-4o"),
    "/api/generate": ({"prompt": "Hi", "stream": False}, OLLAMA_REFUSAL),
    "/api/chat": ({"messages": HELLO, "stream": False}, OLLAMA_REFUSAL),
    "/api/embed": ({"input": "Hi"}, OLLAMA_REFUSAL),
    "/api/show": ({}, OLLAMA_REFUSAL),
}


def test_strict_model_refuses_other_names(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4", "--strict-model") as strict:
        with pytest.raises(openai.NotFoundError):
            strict.client().chat.completions.create(model="gpt-4o", messages=HELLO)
        assert strict.client().chat.completions.create(model="verifier", messages=HELLO).choices[0].message.content
        with strict.http() as http:
            for path, (body, message) in STRICT_REFUSALS.items():
                response = http.post(path, json={"model": "gpt-4o", **body})
                error = response.json()["error"]
                assert (response.status_code, error if isinstance(error, str) else error["message"]) == (404, message)
            named = http.post("/api/generate", json={"model": "verifier", "prompt": "Hi", "stream": False})
            assert named.status_code == 200
