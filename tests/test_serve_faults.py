"""`specgguf serve` under bad requests, hang-ups, a full queue and signals: 4xx answers, never a crash."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from live_server import live_server

HELLO = [{"role": "user", "content": "hello"}]
CHAT = "/v1/chat/completions"
# Chat requests that must be refused: (body, expected status, the `param` the error names).
BAD_CHAT = [
    (b"{", 400, None),
    (b"", 400, None),
    (b"[]", 400, None),
    (b"null", 400, None),
    (b'"hello"', 400, None),
    (b'{"messages": [{"role": "user", "content": "h\xff\xfe"}]}', 400, None),  # invalid UTF-8
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages[0].content[0].type",
    ),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "a"}]}, 400, "messages[0].tool_call_id"),
    ({"messages": [{"role": "function", "content": "42", "name": "f"}]}, 400, "messages[0].role"),
    ({"messages": HELLO, "max_tokens": -2}, 400, "max_tokens"),  # -1 is llama-server's "no limit": the server's
    ({"messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": HELLO, "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 1.5}, 400, "max_tokens"),
    ({"messages": HELLO, "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    ({"messages": HELLO, "temperature": -1}, 400, "temperature"),
    ({"messages": HELLO, "temperature": "hot"}, 400, "temperature"),
    ({"messages": HELLO, "top_p": -0.1}, 400, "top_p"),
    ({"messages": HELLO, "top_k": -3}, 400, "top_k"),
    ({"messages": HELLO, "min_p": 2}, 400, "min_p"),
    ({"messages": HELLO, "stream": "yes"}, 400, "stream"),
    ({"messages": HELLO, "stop": 5}, 400, "stop"),
    ({"messages": HELLO, "stop": [""]}, 400, "stop"),
    ({"messages": HELLO, "stop": ["x" * 501]}, 400, "stop[0]"),
    ({"messages": HELLO, "stop": ["a"] * 17}, 400, "stop"),
    ({"messages": HELLO, "n": 2}, 400, "n"),
    ({"messages": HELLO, "tools": [{"type": "function"}]}, 400, "tools[0].function"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, 400, None),
    ({"messages": HELLO, "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice"),
    ({"messages": HELLO, "functions": [{"name": "f"}]}, 400, "functions"),
    ({"messages": HELLO, "logit_bias": {"one": 5}}, 400, "logit_bias.one"),
    ({"messages": HELLO, "logit_bias": {"1": 500}}, 400, "logit_bias"),
    ({"messages": HELLO, "logprobs": "yes"}, 400, "logprobs"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({"messages": HELLO, "top_logprobs": 3}, 400, "top_logprobs"),
    ({"messages": HELLO, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"messages": HELLO, "frequency_penalty": "high"}, 400, "frequency_penalty"),
    ({"messages": HELLO, "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ({"messages": HELLO, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
    ({"messages": HELLO, "grammar": "root ::= ("}, 400, "grammar"),
    ({"messages": HELLO, "frobnicate": 1}, 400, "frobnicate"),
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"messages": HELLO, "speculative": {"k": "many"}}, 400, "speculative.k"),
    ({"messages": HELLO, "speculative": {"k": 65}}, 400, "speculative.k"),
    ({"messages": HELLO, "speculative": {"drafter": "oracle"}}, 400, "speculative.drafter"),
    ({"messages": HELLO, "speculative": {"depth": 3}}, 400, "speculative.depth"),
    ({"messages": HELLO, "speculative": {"drafter": "model"}}, 400, None),  # no draft model loaded
    ({"messages": HELLO, "speculative": {"drafter": "hybrid", "k": 4}}, 400, None),  # (the server drafts n-grams)
    ({"messages": [{"role": "user", "content": "the cat " * 400}]}, 400, None),  # longer than the context
]
BAD_COMPLETION = [
    ({}, 400, "prompt"),
    ({"prompt": [-2]}, 400, "prompt[0]"),
    ({"prompt": [[1], [2]]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": "hi", "echo": True}, 400, "echo"),
    ({"prompt": "hi", "logprobs": -1}, 400, "logprobs"),
    ({"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ({"prompt": ""}, 400, None),
]


GOOD = {CHAT: {"messages": HELLO, "max_tokens": 4}, "/v1/completions": {"prompt": "the cat", "max_tokens": 4}}


@pytest.fixture(scope="module")
def server(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "8", "--max-body", "65536") as live:
        yield live


def post(http: httpx.Client, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=content, headers={"Content-Type": "application/json"})


def assert_error(response: httpx.Response, status: int, param: str | None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("path, cases", [(CHAT, BAD_CHAT), ("/v1/completions", BAD_COMPLETION)])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, path, cases):
    with server.http() as http:
        for body, status, param in cases:
            assert_error(post(http, path, body), status, param)
        good = post(http, CHAT, {"messages": HELLO, "max_tokens": 4, "temperature": 0})
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1
        ngram = post(http, path, {**GOOD[path], "speculative": {"drafter": "ngram", "k": 4}})
        assert ngram.status_code == 200  # prompt lookup needs no draft model


def test_oversized_bodies_get_413_with_or_without_a_length(server):
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * 70000}]}).encode()
    with server.http() as http:
        assert_error(post(http, CHAT, huge), 413, None)
        chunked = http.post(
            CHAT, content=iter([huge[:40000], huge[40000:]]), headers={"Content-Type": "application/json"}
        )
        assert_error(chunked, 413, None)
        assert post(http, CHAT, {"messages": HELLO, "max_tokens": 2}).status_code == 200


def test_unknown_routes_and_methods(server):
    with server.http() as http:
        assert_error(http.get(CHAT), 405, None)
        assert_error(http.post("/v1/nothing", json={}), 404, None)


# --- a slower model, so that a generation lasts long enough to hang up on or queue behind ---
LONG = {
    "prompt": "Once upon a time",
    "max_tokens": 1500,
    "temperature": 2.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "stream": True,
}  # near-uniform sampling: no early end of generation


@pytest.fixture(scope="module")
def slow(smollm2):
    args = ("-m", smollm2, "--drafter", "ngram", "-c", "2048", "-t", "1", "--queue-size", "1", "--parallel", "1")
    with live_server(*args) as live:
        yield live


def events(response: httpx.Response):
    """A stream's events, as they come (the data of each `data:` line)."""
    return (line[6:] for line in response.iter_lines() if line.startswith("data: "))


def first_text(stream) -> str:
    for data in stream:
        event = json.loads(data)
        if event["choices"] and event["choices"][0]["text"]:
            return event["choices"][0]["text"]
    raise AssertionError("the stream ended before any text")


def wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def greedy_text(http: httpx.Client) -> str:
    response = post(http, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_a_client_that_hangs_up_stops_its_generation(slow):
    with slow.http() as http:
        before_text = greedy_text(http)
        generated_before = slow.metric("specgguf_tokens_generated_total")
        with http.stream("POST", "/v1/completions", json=LONG) as response:
            first_text(events(response))
        # The next request runs once the abandoned one has stopped; the caches are as good as before.
        assert greedy_text(http) == before_text
        generated = slow.metric("specgguf_tokens_generated_total") - generated_before
        assert generated < LONG["max_tokens"]


def test_a_full_queue_answers_503_with_retry_after(slow):
    with slow.http() as http, slow.http() as other, ThreadPoolExecutor(1) as pool:
        with http.stream("POST", "/v1/completions", json=LONG) as running:
            stream = events(running)  # (kept: dropping the iterator would close the connection)
            first_text(stream)  # generating now
            waiting = pool.submit(greedy_text, other)
            wait_for(lambda: http.get("/health").json()["queue_length"] == 1)
            with slow.http() as third:
                busy = post(third, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            assert_error(busy, 503, None)
            assert busy.headers["Retry-After"] == "1"
            assert not waiting.done()
        assert waiting.result(timeout=60)  # served once the running one was abandoned


def test_sigterm_ends_streams_and_exits_cleanly(smollm2):
    # --parallel 1: a second request waits in the queue while the first runs.
    with live_server("-m", smollm2, "--drafter", "ngram", "-c", "2048", "-t", "1", "--parallel", "1") as live:
        with (
            live.http() as http,
            live.http() as other,
            ThreadPoolExecutor(1) as pool,
            http.stream("POST", "/v1/completions", json=LONG) as response,
        ):
            stream = events(response)
            first_text(stream)
            queued = pool.submit(post, other, "/v1/completions", {"prompt": "hi", "max_tokens": 4})
            wait_for(lambda: http.get("/health").json()["queue_length"] == 1)
            live.process.send_signal(signal.SIGTERM)
            rest = list(stream)
            assert_error(queued.result(timeout=30), 503, None)  # the waiting request: turned away
        assert rest and "shutting down" in rest[-1]  # the running stream: an error event, then the end
        assert live.stop(timeout=30) == 0, live.stderr
        assert "Traceback" not in live.stderr


def test_a_client_that_leaves_the_queue_is_never_served(slow):
    with slow.http() as http:
        generated_before = slow.metric("specgguf_tokens_generated_total")
        with http.stream("POST", "/v1/completions", json=LONG) as running:
            stream = events(running)
            first_text(stream)
            with (
                httpx.Client(base_url=slow.base_url, timeout=httpx.Timeout(30, read=1)) as impatient,
                pytest.raises(httpx.ReadTimeout),
            ):  # queued behind the running one: gives up, hangs up
                impatient.post("/v1/completions", json=LONG)
            wait_for(lambda: http.get("/health").json()["queue_length"] == 0)  # it gave its place up
        assert greedy_text(http)  # runs next: the abandoned request was skipped, not generated
        assert slow.metric("specgguf_tokens_generated_total") - generated_before < LONG["max_tokens"]
        assert slow.metric('specgguf_requests_total{endpoint="/v1/completions",status="499"}') >= 1
