"""Ollama's API through the real `ollama` client, against a live server (tiny GGUF pair)."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from live_server import live_server
from specgguf.llama.info import file_type_name

GREEDY = {"temperature": 0, "num_predict": 10}


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    # A fixed K: seeded sampling repeats (an adaptive K learns between requests, and draws differ).
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-n", "12", "-k", "3") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base_url)


def test_chat_whole_and_streamed_agree(client, server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello the cat"}]
    whole = client.chat(model="anything:latest", messages=messages, options=GREEDY, keep_alive="5m")
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.message.content and 1 <= whole.eval_count <= 10 and whole.prompt_eval_count > 3
    parts = list(client.chat(model="anything", messages=messages, options=GREEDY, stream=True))
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    # The same answer as the OpenAI endpoint gives for the same conversation.
    openai_answer = server.client().chat.completions.create(model="x", messages=messages, temperature=0, max_tokens=10)
    assert openai_answer.choices[0].message.content == whole.message.content


def test_generate_whole_streamed_and_raw(client):
    whole = client.generate(model="verifier", prompt="the cat was", options=GREEDY)
    assert whole.done and whole.response
    streamed = list(client.generate(model="verifier", prompt="the cat was", options=GREEDY, stream=True))
    assert "".join(part.response for part in streamed) == whole.response
    raw = client.generate(model="verifier", prompt="the cat was", raw=True, options={**GREEDY, "stop": ["\n"]})
    assert raw.done and "\n" not in raw.response
    system = client.generate(model="verifier", prompt="the cat was", system="Be brief.", options=GREEDY)
    assert system.prompt_eval_count > whole.prompt_eval_count


def test_options_map_to_sampling(client):
    seeded = [
        client.generate(model="v", prompt="the dog", options={"temperature": 1.0, "seed": 7, "num_predict": 8}).response
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    short = client.generate(model="v", prompt="the dog", options={"num_predict": 3, "temperature": 0})
    assert short.eval_count <= 3 and short.done_reason == "length"
    penalised = client.generate(
        model="v", prompt="the dog", options={**GREEDY, "repeat_penalty": 1.5, "repeat_last_n": 32, "num_ctx": 8192}
    )
    assert penalised.done


def test_list_show_ps_and_version(client, server):
    listed = client.list()
    assert [model.model for model in listed.models] == ["verifier"]
    assert listed.models[0].details.format == "gguf" and listed.models[0].size > 0
    shown = client.show("verifier")
    assert shown.details.family == "llama" and "general.architecture" in shown.modelinfo
    assert shown.details.quantization_level == listed.models[0].details.quantization_level == "F32"
    assert "im_start" in shown.template
    assert client.ps().models[0].context_length == 512
    with server.http() as http:
        assert http.get("/api/version").json()["version"].count(".") == 2


def test_quantization_is_named_from_the_gguf_file_type():
    # llama.cpp's description says "Q4_K - Medium"; Ollama (and llama.cpp's quantize) say "Q4_K_M".
    assert [file_type_name(value) for value in ("15", "7", "0", "1", "32")] == ["Q4_K_M", "Q8_0", "F32", "F16", "BF16"]
    assert file_type_name(None) == file_type_name("9999") == file_type_name("x") == ""


def test_bad_bodies_get_ollamas_error_shape_and_the_server_keeps_serving(client, server):
    with server.http() as http:
        for body in (
            b"{",
            json.dumps({"model": "v", "messages": "hi"}).encode(),
            json.dumps(
                {"model": "v", "messages": [{"role": "user", "content": "x"}], "options": {"mirostat": 2}}
            ).encode(),
            json.dumps({"model": "v", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}).encode(),
            json.dumps({"model": "v", "prompt": "x", "format": {"type": "nonsense"}}).encode(),
        ):
            path = "/api/generate" if b"prompt" in body else "/api/chat"
            response = http.post(path, content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and set(response.json()) == {"error"}, response.text
            assert "Traceback" not in response.text
        assert set(http.post("/api/nothing", json={}).json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="v", messages=[{"role": "user", "content": "hi"}], options={"typical_p": 0.5})
    assert refused.value.status_code == 400 and "typical_p" in refused.value.error
    assert client.chat(model="v", messages=[{"role": "user", "content": "hi"}], options=GREEDY).done


def test_the_api_key_rule_holds(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4", api_key="s3cret") as keyed:
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=keyed.base_url).list()
        assert refused.value.status_code == 401
        authorised = ollama.Client(host=keyed.base_url, headers={"Authorization": "Bearer s3cret"})
        assert authorised.generate(model="v", prompt="the cat", options=GREEDY).done
        assert httpx.get(keyed.base_url + "/api/tags").json() == {
            "error": "missing or wrong API key: send 'Authorization: Bearer <key>'"
        }
