"""Small hostile or careless requests (issue 36): a denormal repeat penalty, an API key with spaces
around it or only spaces, an empty embeddings input, and Ollama's own `curl -d` examples, which send
JSON as form data. Each is one error line, the API's own 4xx, or what a user meant."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest

from live_server import live_server
from specgguf.core.sampling import Penalties, SamplingSettings, apply_penalties, sparse_distribution

SERVE_DOC = Path(__file__).parent.parent / "docs" / "serve.md"


def test_a_denormal_repeat_penalty_is_its_limit_not_an_overflow():
    logits = np.array([2.0, 1.0, -1.0, 0.5], dtype=np.float32)
    settings = SamplingSettings(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, penalties=Penalties(repeat=1e-310))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in divide"
        tokens, probs = sparse_distribution(apply_penalties(logits, [1, 2], settings), settings)
    # Divided by ~0, the repeated token 1's logit is the largest by far; it came out inf, and was dropped.
    assert dict(zip(tokens.tolist(), probs.tolist(), strict=True))[1] == pytest.approx(1.0)


def test_an_api_key_of_only_spaces_is_refused_at_start(cli, tmp_path):
    result = cli("serve", "-m", tmp_path / "missing.gguf", "--api-key", "   ")
    assert "--api-key is only spaces" in result.error_line()  # no client could ever send it


@pytest.fixture(scope="module")
def server(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4", api_key="  s3cret ") as live:
        yield live


def _http(server, key: str = "s3cret") -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_an_api_key_with_spaces_around_it_is_the_key_without_them(server):
    with _http(server) as http:  # it was accepted at start and never matched
        assert http.post("/v1/completions", json={"prompt": "the", "max_tokens": 1}).status_code == 200
    with _http(server, "s3cretx") as http:
        assert http.post("/v1/completions", json={"prompt": "the", "max_tokens": 1}).status_code == 401


def test_an_empty_embeddings_input_is_a_400(server):
    with _http(server) as http:
        for empty in ([], [[]], ""):  # [] was a 500
            answer = http.post("/v1/embeddings", json={"input": empty})
            assert answer.status_code == 400 and answer.json()["error"]["param"].startswith("input"), answer.text


def test_a_denormal_repeat_penalty_through_ollamas_api(server):
    body = {"model": "m", "prompt": "the cat", "stream": False, "options": {"repeat_penalty": 1e-310}}
    with _http(server) as http:
        answer = http.post("/api/generate", json=body)
    assert answer.status_code == 200 and answer.json()["done"] is True, answer.text


def test_ollamas_curl_examples_send_form_data_and_are_answered(server):
    """serve.md's own Ollama example (curl -d, as Ollama's docs write it) got a 415."""
    block = re.search(r"```sh\n(curl http://127\.0\.0\.1:8080/api/chat .*?)```", SERVE_DOC.read_text(), re.S)
    assert block is not None
    command = shlex.split(block.group(1).replace("8080", str(server.port)).replace("\\\n", " "))
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    answer = subprocess.run(
        [*command, "-sS", "-H", "Authorization: Bearer s3cret"], capture_output=True, text=True, timeout=120
    )
    assert answer.returncode == 0 and '"done":true' in answer.stdout.replace(" ", ""), answer.stdout + answer.stderr
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = '{"model": "m", "prompt": "the", "stream": false, "options": {"num_predict": 1}}'
    with _http(server) as http:
        assert http.post("/api/generate", content=body, headers=form).status_code == 200
        # A browser page always sends an Origin with a POST: it must still send JSON (and ask first).
        page = {**form, "Origin": server.base_url}
        assert http.post("/api/generate", content=body, headers=page).status_code == 415
        # OpenAI's routes take JSON only, as before.
        assert http.post("/v1/completions", content=body, headers=form).status_code == 415
