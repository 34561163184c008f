"""`specgguf serve` through the real openai SDK, against a live server on 127.0.0.1 (tiny GGUF pair)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from live_server import LiveServer, free_port, live_server

MODEL = "verifier"  # the tiny verifier's file name
GREEDY = {"temperature": 0, "extra_body": {"speculative": {"k": 3}}}


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-n", "24") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def chat(client, content: str, **options):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **options)


def test_models_lists_the_verifier(client):
    assert [model.id for model in client.models.list()] == ["verifier"]
    assert client.models.retrieve("verifier").owned_by == "specgguf"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_chat_completion_has_openai_shape_usage_and_timings(client):
    response = chat(client, "hello the cat", max_tokens=12, **GREEDY)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens > 3 and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    timings = response.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert timings["predicted_n"] == usage.completion_tokens
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]  # the tiny draft mostly agrees
    assert timings["predicted_per_second"] > 0


def test_streamed_chat_is_the_same_answer_in_chunks(client):
    whole = chat(client, "and the dog?", max_tokens=20, **GREEDY)
    chunks = list(
        chat(client, "and the dog?", max_tokens=20, stream=True, stream_options={"include_usage": True}, **GREEDY)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_text_completion_whole_and_streamed(client):
    whole = client.completions.create(model=MODEL, prompt="the cat was", max_tokens=16, **GREEDY)
    assert whole.object == "text_completion" and whole.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="the cat was", max_tokens=16, stream=True, **GREEDY))
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_max_tokens_and_max_completion_tokens_bound_the_answer(client):
    for options in ({"max_tokens": 5}, {"max_completion_tokens": 5}):
        response = chat(client, "tell me a long story about the sea", **options, **GREEDY)
        assert response.choices[0].finish_reason == "length"
        assert response.usage.completion_tokens == 5


def test_seed_makes_sampling_repeatable(client):
    def sample(seed):
        return (
            chat(
                client,
                "what is the time",
                max_tokens=20,
                temperature=1.0,
                seed=seed,
                extra_body={"speculative": {"k": 3}},
            )
            .choices[0]
            .message.content
        )

    assert sample(11) == sample(11)
    assert len({sample(11), sample(12), sample(13)}) > 1


def test_speculative_overrides_per_request(client):
    plain = chat(client, "the end", max_tokens=16, temperature=0, extra_body={"speculative": {"k": 0}})
    assert plain.model_extra["timings"]["draft_n"] == 0
    for speculative in ({"k": 4}, {"k": "adaptive"}, {"drafter": "hybrid", "k": 4}, {"k": 4, "p_min": 0.5}):
        response = chat(client, "the end", max_tokens=16, temperature=0, extra_body={"speculative": speculative})
        assert response.choices[0].message.content == plain.choices[0].message.content, speculative
    assert (
        chat(client, "the end", max_tokens=16, temperature=0, extra_body={"speculative": {"k": 4}}).model_extra[
            "timings"
        ]["draft_n"]
        > 0
    )
    with pytest.raises(openai.BadRequestError, match="speculative.k"):
        chat(client, "the end", extra_body={"speculative": {"k": -1}})


@pytest.mark.parametrize("k", [0, 3])
def test_greedy_answers_match_specgguf_run(cli, client, tiny_verifier, tiny_draft, k):
    prompt = f"why the sea is water {k}"
    served = chat(client, prompt, temperature=0, extra_body={"speculative": {"k": k}})
    run = cli(
        "run",
        "-m",
        tiny_verifier,
        "-md",
        tiny_draft,
        "-c",
        "512",
        "-t",
        "1",
        "--temp",
        "0",
        "-k",
        k,
        "-n",
        "24",
        "--json",
        prompt,
    )
    assert run.returncode == 0, run.stderr
    assert served.choices[0].message.content == json.loads(run.stdout)["text"]


def stop_inside_a_burst(chunks: list[str]) -> tuple[str, int]:
    """A stop string that starts in the middle of the longest streamed chunk (one verify step: its
    accepted drafts and the verifier's token) and occurs nowhere earlier; and where it starts."""
    full, starts = "".join(chunks), [sum(map(len, chunks[:i])) for i in range(len(chunks))]
    for index in sorted(range(len(chunks)), key=lambda i: -len(chunks[i])):
        middle = starts[index] + len(chunks[index]) // 2
        stop = full[middle : middle + 3]
        if len(stop) == 3 and stop.strip() and full.find(stop) == middle:
            return stop, middle
    pytest.fail(f"no stop string to cut {chunks!r} with")


def check_stop_cuts_inside_a_burst(client, messages, options):
    model = client.models.list().data[0].id
    chunks = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **options)
        if chunk.choices
    ]
    stop, middle = stop_inside_a_burst(chunks)
    cut = client.chat.completions.create(model=model, messages=messages, stop=[stop, "\x00never"], **options)
    assert cut.choices[0].message.content == "".join(chunks)[:middle]
    assert cut.choices[0].finish_reason == "stop"
    timings = cut.model_extra["timings"]
    assert timings["draft_n_accepted"] > 0
    # The step that reached the stop string generated tokens after it, and none of them showed.
    assert timings["predicted_n"] > cut.usage.completion_tokens
    streamed = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, stop=stop, **options)
        if chunk.choices
    ]
    assert "".join(streamed) == "".join(chunks)[:middle]  # no chunk leaked text from after the stop string


def test_stop_string_inside_an_accepted_burst_cuts_exactly_there(client):
    check_stop_cuts_inside_a_burst(
        client,
        [{"role": "user", "content": "hello the cat"}],
        {"max_tokens": 24, "temperature": 0, "extra_body": {"speculative": {"k": 6}}},
    )


@pytest.fixture(scope="module")
def smol(smollm2):
    with live_server("-m", smollm2, "--drafter", "ngram", "-c", "1024", "-t", "1", "-n", "40") as live:
        yield live


def test_ngram_drafts_on_a_repeating_prompt_and_a_stop_string_cuts_in_their_burst(smol):
    text = "The quick brown fox jumps over the lazy dog. " * 2
    check_stop_cuts_inside_a_burst(
        smol.client(),
        [{"role": "user", "content": f"Copy this text exactly: {text}"}],
        {"max_tokens": 40, "temperature": 0, "extra_body": {"speculative": {"k": 6}}},
    )


def test_a_follow_up_turn_reuses_the_cached_conversation(smol):
    client = smol.client()
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "Name three colours."}]
    first = client.chat.completions.create(model=model, messages=question, max_tokens=12, **GREEDY)
    answer = first.choices[0].message.content
    follow_up = client.chat.completions.create(
        model=model,
        max_tokens=4,
        **GREEDY,
        messages=[*question, {"role": "assistant", "content": answer}, {"role": "user", "content": "And two more?"}],
    )
    timings = follow_up.model_extra["timings"]
    # Both turns' tokens came from the cache (the follow-up is tokenized fresh, and SmolLM2's answer
    # is its text's own tokenization)...
    assert timings["cache_n"] >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert timings["prompt_n"] + timings["cache_n"] == follow_up.usage.prompt_tokens
    assert timings["prompt_n"] < follow_up.usage.prompt_tokens / 3  # ... and only the new turn was evaluated


def test_logprobs_are_the_verifiers_own_while_speculating(client):
    def ask(k, **options):
        return chat(
            client,
            "hello the cat",
            max_tokens=16,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            extra_body={"speculative": {"k": k}},
            **options,
        )

    speculative, plain = ask(4), ask(0)
    assert speculative.model_extra["timings"]["draft_n_accepted"] > 0
    entries = speculative.choices[0].logprobs.content
    assert len(entries) == speculative.usage.completion_tokens
    text = b"".join(bytes(entry.bytes) for entry in entries).decode("utf-8", errors="replace")
    assert text == speculative.choices[0].message.content
    for entry, alone in zip(entries, plain.choices[0].logprobs.content, strict=True):
        assert entry.token == alone.token
        assert entry.logprob == pytest.approx(alone.logprob, abs=1e-3)  # accepted drafts' too
        # Greedy: each token is the verifier's most likely one.
        assert [top.token for top in entry.top_logprobs][0] == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert [top.logprob for top in entry.top_logprobs] == sorted(
            (top.logprob for top in entry.top_logprobs), reverse=True
        )
    streamed = [
        entry
        for chunk in ask(4, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [(entry.token, entry.logprob) for entry in streamed] == [(entry.token, entry.logprob) for entry in entries]


def test_legacy_completion_logprobs(client):
    response = client.completions.create(model=MODEL, prompt="the cat was", max_tokens=10, logprobs=2, **GREEDY)
    choice = response.choices[0]
    assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == response.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset[0] == 0 and choice.logprobs.text_offset == sorted(choice.logprobs.text_offset)


def test_system_messages_and_text_parts_are_accepted(client):
    response = client.chat.completions.create(
        model=MODEL,
        max_tokens=6,
        **GREEDY,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "cat"}]},
        ],
    )
    assert response.usage.prompt_tokens > 6


def test_eight_concurrent_clients_get_the_answers_they_would_get_alone(client):
    prompts = [f"the number {i} is" for i in range(8)]
    alone = [chat(client, prompt, **GREEDY).choices[0].message.content for prompt in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda prompt: chat(client, prompt, **GREEDY), prompts))
    assert [response.choices[0].message.content for response in together] == alone
    assert all(response.choices[0].finish_reason in ("stop", "length") for response in together)


def test_metrics_count_tokens_drafts_and_requests(server, client):
    before = {
        name: server.metric(name)
        for name in (
            "specgguf_tokens_generated_total",
            "specgguf_tokens_drafted_total",
            "specgguf_tokens_accepted_total",
        )
    }
    response = chat(client, "the cat and the dog", max_tokens=10, **GREEDY)
    timings = response.model_extra["timings"]
    assert (
        server.metric("specgguf_tokens_generated_total") - before["specgguf_tokens_generated_total"]
        == timings["predicted_n"]
    )
    assert (
        server.metric("specgguf_tokens_drafted_total") - before["specgguf_tokens_drafted_total"] == timings["draft_n"]
    )
    assert (
        server.metric("specgguf_tokens_accepted_total") - before["specgguf_tokens_accepted_total"]
        == timings["draft_n_accepted"]
    )
    assert (
        server.metric('specgguf_drafts_by_position_total{position="0"}')
        >= server.metric('specgguf_drafts_accepted_by_position_total{position="0"}')
        > 0
    )
    assert server.metric("specgguf_time_to_first_token_seconds_count") >= 1
    assert server.metric("specgguf_tokens_per_second_count") >= 1
    assert server.metric("specgguf_queue_length") == 0
    assert server.metric('specgguf_requests_total{endpoint="/v1/chat/completions",status="200"}') >= 1


def test_metrics_name_every_apis_endpoints(server):
    """Each API lists its endpoints (apis/*.ENDPOINTS) for /metrics: their requests are counted by
    name, OpenAI's routes without /v1 under their /v1 name, a path no API has as "other"."""
    calls = [
        ("GET", "/api/version", None, "/api/version"),
        ("GET", "/api/tags", None, "/api/tags"),
        ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
         "/v1/messages/count_tokens"),
        ("POST", "/embeddings", {"input": ""}, "/v1/embeddings"),  # a 400, counted as such
        ("POST", "/api/embed", {"model": MODEL, "input": ""}, "/api/embed"),
        ("GET", "/models", None, "/v1/models"),
        ("GET", "/v1/models/verifier", None, "/v1/models/{id}"),
        ("GET", "/no/such/route", None, "other"),
    ]  # fmt: skip
    with server.http() as http:
        for method, path, body, endpoint in calls:
            status = http.request(method, path, json=body).status_code
            label = f'specgguf_requests_total{{endpoint="{endpoint}",status="{status}"}}'
            assert server.metric(label) >= 1, (path, status)


LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}  # llama-server's


def test_health_says_loading_until_the_grammar_tables_are_built(gemma270m):
    """Gemma 3's 262k tokens take seconds to index for grammars (tool calls, JSON schemas): until they
    are, /health answers llama-server's 503 "Loading model", so a client that waits for it (an agent,
    a load balancer, a benchmark) does not send its first tool call into that wait. Then it stays 200."""
    port = free_port()
    command = [sys.executable, "-m", "specgguf", "serve", "-m", gemma270m, "-c", "512", "-t", "1", "--port", str(port)]
    server = LiveServer(
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), port, None
    )
    seen: list[tuple[int, dict]] = []
    try:
        deadline = time.monotonic() + 120
        with server.http() as http:
            while time.monotonic() < deadline and [status for status, _ in seen].count(200) < 5:
                assert server.process.poll() is None, server.process.stderr
                try:
                    answer = http.get("/health", timeout=5)
                    seen.append((answer.status_code, answer.json()))
                except httpx.TransportError:
                    pass  # (the port listens from the start; the server answers once the models are loaded)
                time.sleep(0.02)
        assert server.stop() == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    statuses = [status for status, _ in seen]
    first_ok = statuses.index(200)
    assert first_ok > 0 and all(body == LOADING for _, body in seen[:first_ok]), seen[:3]
    assert set(statuses[first_ok:]) == {200} and seen[-1][1] == {"status": "ok", "queue_length": 0}


def test_api_key_is_required_when_set(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", api_key="s3cret") as server:
        assert chat(server.client(), "hello", max_tokens=3).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            chat(server.client(api_key="wrong"), "hello", max_tokens=3)
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            assert http.get("/health").status_code == 200  # for load balancers: no key needed
            missing = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
            assert http.get("/v1/models").status_code == 401
            assert http.get("/metrics", headers={"Authorization": "Basic s3cret"}).status_code == 401


def test_a_public_address_needs_an_api_key(cli, tiny_verifier):
    result = cli("serve", "-m", tiny_verifier, "--host", "0.0.0.0", env={"SPECGGUF_API_KEY": None})
    assert result.returncode == 2
    assert result.stderr.startswith("specgguf: error: refusing to serve on 0.0.0.0")
    assert result.stderr.count("\n") == 1


def test_a_taken_port_is_a_one_line_error(cli, tiny_verifier):
    with socket.socket() as taken:  # a new process: if the port were ever served, the timeout ends it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        # -k 0: no draft is looked for (that would say so on stderr first)
        result = cli.process("serve", "-m", tiny_verifier, "-k", "0", "--port", taken.getsockname()[1], timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("specgguf: error: cannot listen on 127.0.0.1:") and result.stderr.count("\n") == 1
