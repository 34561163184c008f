"""/v1/embeddings (the openai SDK) and Ollama's /api/embed and /api/embeddings (the `ollama` client) from the
verifier, against a live server (tiny model); the limits, and a client that hangs up."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import ollama
import pytest

from live_server import live_server
from openai_schema import assert_conforms


@pytest.fixture(scope="module")
def server(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "8") as live:
        yield live


def test_embeddings_through_the_sdk(server):
    client = server.client()
    texts = ["the cat sat on the mat", "the cat sat on the mat", "water and the sea"]
    result = client.embeddings.create(model="text-embedding-3-small", input=texts)  # the SDK asks for base64
    vectors = np.array([item.embedding for item in result.data])
    assert vectors.shape == (3, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] == pytest.approx(1.0, abs=1e-5) and vectors[0] @ vectors[2] < 0.99
    assert result.usage.prompt_tokens > 10
    single = client.embeddings.create(model="m", input="the cat sat on the mat", encoding_format="float")
    assert np.allclose(single.data[0].embedding, vectors[0], atol=1e-5)
    # Generation goes on as before beside the embedding context.
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.content


def test_the_body_follows_openais_schema_and_bad_bodies_are_400s(server):
    with server.http() as http:
        body = http.post("/v1/embeddings", json={"input": [[5, 6, 7]], "encoding_format": "float"}).json()
        assert_conforms(body, "CreateEmbeddingResponse")
        assert http.post("/embeddings", json={"input": "the cat"}).status_code == 200
        for bad, param in (({}, "input"), ({"input": 5}, "input"), ({"input": "x", "dimensions": 8}, "dimensions")):
            response = http.post("/v1/embeddings", json=bad)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert http.post("/v1/embeddings", json={"input": ""}).status_code == 400
        assert http.post("/v1/embeddings", json={"input": [10**7]}).status_code == 400
        assert http.post("/v1/embeddings", json={"input": "the dog"}).status_code == 200


def test_ollamas_embed_and_embeddings_through_the_client(server):
    """Ollama's /api/embed and older /api/embeddings: the same vectors as /v1/embeddings."""
    client = ollama.Client(host=server.base_url)
    texts = ["the cat sat on the mat", "water and the sea"]
    openai_vectors = [item.embedding for item in server.client().embeddings.create(model="m", input=texts).data]
    both = client.embed(model="nomic-embed-text", input=texts, keep_alive="5m", options={"num_ctx": 8192})
    assert both.model == "nomic-embed-text" and len(both.embeddings) == 2
    assert np.allclose(both.embeddings, openai_vectors, atol=1e-5)
    assert both.prompt_eval_count > 5 and both.total_duration > 0 and both.load_duration == 0
    one = client.embed(model="m", input=texts[0])
    assert np.allclose(one.embeddings, openai_vectors[:1], atol=1e-5) and one.prompt_eval_count < both.prompt_eval_count
    older = client.embeddings(model="m", prompt=texts[1])
    assert np.allclose(older.embedding, openai_vectors[1], atol=1e-5)
    # `dimensions`: the first N values, normalised again.
    short = np.array(client.embed(model="m", input=texts[0], dimensions=16).embeddings[0])
    head = np.array(openai_vectors[0][:16])
    assert short.shape == (16,) and np.allclose(short, head / np.linalg.norm(head), atol=1e-5)
    # An empty input only loads the model, as Ollama's does.
    assert client.embed(model="m", input="").embeddings == [] and client.embed(model="m", input=[]).embeddings == []
    assert client.embeddings(model="m", prompt="").embedding == []


def test_ollamas_truncate_and_errors(server):
    client = ollama.Client(host=server.base_url)
    long_text = "the cat sat on the mat and " * 200  # far more tokens than the context's 256
    cut = client.embed(model="m", input=long_text)  # Ollama truncates by default
    assert cut.prompt_eval_count == 256 and len(cut.embeddings[0]) == 64
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="m", input=long_text, truncate=False)
    assert refused.value.status_code == 400 and "context holds 256" in refused.value.error
    assert len(client.embeddings(model="m", prompt=long_text).embedding) == 64
    with server.http() as http:
        for path, bad in (("/api/embed", {"model": "m", "input": [1, 2]}), ("/api/embeddings", {"prompt": "x"})):
            response = http.post(path, json=bad)
            assert response.status_code == 400 and set(response.json()) == {"error"}, response.text
        too_many = http.post("/api/embed", json={"model": "m", "input": ["a"] * 2049})
        assert too_many.status_code == 400 and "2048" in too_many.json()["error"]


def test_embedding_limits_are_400s_in_openais_shape(server):
    """A count limit on inputs (2048) and on tokens per request (300,000), each named in the error."""
    with server.http() as http:
        too_many = http.post("/v1/embeddings", json={"input": [[5]] * 2049}).json()["error"]
        assert too_many["param"] == "input" and "2048" in too_many["message"]
        too_long = http.post("/v1/embeddings", json={"input": [[5] * 256] * 1200})  # 307,200 tokens
        assert too_long.status_code == 400 and set(too_long.json()["error"]) == {"message", "type", "param", "code"}
        assert "300000" in too_long.json()["error"]["message"]
        assert http.post("/v1/embeddings", json={"input": [[5] * 256] * 4}).status_code == 200


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the server's CPU time from /proc")
def test_a_client_that_hangs_up_stops_its_embeddings_and_others_are_served(server):
    """The biggest request the limits allow (about 8 s of embedding here), sent whole over a raw socket;
    its client hangs up. The worker stops at its next input (the server's CPU goes quiet), and a second
    client's /health and chat answer come back at once. Other clients are served while it runs, too."""
    body = json.dumps({"input": [[5] * 256] * 1170, "encoding_format": "float"}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(head + body)
        time.sleep(0.5)  # the job is running
        with server.http() as http:
            started = time.monotonic()
            assert http.get("/health", timeout=10).status_code == 200
            chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
            assert time.monotonic() - started < 5  # while the embeddings run: they take turns
    time.sleep(1.0)  # the worker notices at its next input (a few milliseconds)
    before = _cpu_seconds(server.process.pid)
    time.sleep(3.0)
    assert _cpu_seconds(server.process.pid) - before < 0.5  # the job stopped (running: a core's worth)
    with server.http() as http:
        assert http.get("/health", timeout=5).json()["queue_length"] == 0
        assert http.post("/v1/embeddings", json={"input": "the cat"}, timeout=10).status_code == 200
