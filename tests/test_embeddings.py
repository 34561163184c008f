"""/v1/embeddings from the verifier through the openai SDK, against a live server (tiny model)."""

from __future__ import annotations

import numpy as np
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
