"""`serve --parallel N`: several requests at once, each on a live sequence of its own, with the real
`openai` and `ollama` clients against a live server (tiny GGUF pair with FIM tokens)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import ollama
import pytest

from live_server import live_server
from specgguf.serve.parallel.lanes import CONTINUE_WAIT, Lanes
from specgguf.serve.parallel.sizing import default_parallel
from tiny_gguf import tiny_vocab, write_tiny_llama

GREEDY = {"temperature": 0, "extra_body": {"speculative": {"k": 3}}}
SCHEMA = {  # as test_serve_structured's: a random model spends many tokens on JSON's whitespace
    "type": "object",
    "properties": {"word": {"enum": ["cat", "dog", "sea"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["word", "count"],
    "additionalProperties": False,
}
INFILL = {"input_prefix": "def add(a, b):\n    return", "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 12}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A verifier with FIM tokens and its noisy draft (the same vocabulary)."""
    n = len(tiny_vocab())
    texts = {n - 3: "<|fim_prefix|>", n - 2: "<|fim_suffix|>", n - 1: "<|fim_middle|>"}
    folder = tmp_path_factory.mktemp("parallel")
    verifier = write_tiny_llama(folder / "coder.gguf", base_seed=7, token_text_override=texts)
    draft = write_tiny_llama(folder / "draft.gguf", base_seed=7, seed=1, noise=0.05, token_text_override=texts)
    return verifier, draft


@pytest.fixture(scope="module")
def server(pair):
    verifier, draft = pair
    args = ("-m", verifier, "-md", draft, "-c", "512", "-t", "1", "-n", "200", "--parallel", "4")
    with live_server(*args) as live:
        yield live


def _chat(client, content, **options):
    return client.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": content}], **{**GREEDY, **options}
    )


def _streamed(client, content, **options) -> str:
    chunks = _chat(client, content, stream=True, **options)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def _alone(server) -> dict[str, str]:
    """Each request's greedy answer with nothing else running."""
    client = server.client()
    with server.http() as http:
        infill = http.post("/infill", json={**INFILL, "temperature": 0}).json()["content"]
    return {
        "chat": _streamed(client, "the cat sat on the", max_tokens=40),
        "schema": _chat(client, "a person", max_tokens=200, response_format=_schema_format())
        .choices[0]
        .message.content,
        "ollama": ollama.Client(host=server.base_url)
        .chat(
            model="coder",
            messages=[{"role": "user", "content": "the dog"}],
            options={"temperature": 0, "num_predict": 30},
        )
        .message.content,
        "infill": infill,
    }


def _schema_format() -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


def test_four_clients_at_once_each_get_their_own_answer(server):
    """Four streams at once (openai chat, a JSON schema, Ollama's chat, /infill) and a fifth cancelled
    midway: each answer is the one it gets alone, token for token (greedy)."""
    alone = _alone(server)
    json.loads(alone["schema"])  # the schema's answer is JSON
    client = server.client()
    started = threading.Event()

    def cancelled() -> int:
        stream = _chat(client, "a long story about the cat", stream=True, max_tokens=40)
        n_chunks = 0
        for _ in stream:
            n_chunks += 1
            started.set()
            if n_chunks == 3:
                break
        stream.close()  # the client hangs up midway
        return n_chunks

    def infill() -> str:
        started.wait(30)  # a FIM request while the others stream
        with server.http() as http:
            return http.post("/infill", json={**INFILL, "temperature": 0}).json()["content"]

    work = {
        "chat": lambda: _streamed(client, "the cat sat on the", max_tokens=40),
        "schema": lambda: (
            _chat(client, "a person", max_tokens=200, response_format=_schema_format()).choices[0].message.content
        ),
        "ollama": lambda: "".join(
            part.message.content
            for part in ollama.Client(host=server.base_url).chat(
                model="coder",
                messages=[{"role": "user", "content": "the dog"}],
                options={"temperature": 0, "num_predict": 30},
                stream=True,
            )
        ),
        "infill": infill,
        "cancelled": cancelled,
    }
    with ThreadPoolExecutor(len(work)) as pool:
        futures = {name: pool.submit(call) for name, call in work.items()}
        answers = {name: future.result(timeout=120) for name, future in futures.items()}
    assert answers.pop("cancelled") == 3
    assert answers == alone
    # The cancelled request's sequence is free again: four more at once still answer.
    with ThreadPoolExecutor(4) as pool:
        again = list(pool.map(lambda _: _streamed(client, "the cat sat on the", max_tokens=40), range(4)))
    assert again == [alone["chat"]] * 4


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_the_startup_line_says_how_many_at_once(pair, parallel):
    """--parallel 1 is one request at a time, as before: its startup line says nothing of it."""
    verifier, draft = pair
    with live_server("-m", verifier, "-md", draft, "-c", "512", "-t", "1", "-n", "8", "-np", parallel) as live:
        assert _chat(live.client(), "the cat", max_tokens=8).choices[0].message.content is not None
    line = " ".join(live.stderr.split())  # as the console wrapped it
    assert ("2 requests at once" in line) == (parallel == "2")
    assert ("KiB of KV cache each" in line) == (parallel == "2")  # a tiny model's


# --- which lane a request takes (in process) ------------------------------------------------------


class _Views:
    """A model whose `sequences` are plain caches (what `Lanes` reads of a view)."""

    def sequences(self, n_seq: int, wait_seconds: float = 0.0, calibrate: bool = False):
        return [SimpleNamespace(cached=[], n_past=0) for _ in range(n_seq)]


def _hold(lane, tokens: list[int], *, fim: bool = False) -> None:
    lane.verifier.cached, lane.verifier.n_past = list(tokens), len(tokens)
    lane.prompt, lane.fim = list(tokens[:-2]), fim  # the last prompt, and its answer's two tokens


def test_a_request_takes_the_lane_it_continues_and_a_new_one_an_empty_lane():
    lanes = Lanes(_Views(), None, 4)
    system, chat, code = [1, 2, 3, 4], [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26, 27]
    _hold(lanes.lanes[0], system + chat)
    _hold(lanes.lanes[1], code, fim=True)
    _hold(lanes.lanes[3], [60, 61, 62, 63])
    lanes.lanes[2].used = -1.0  # an empty lane
    follow_up = lanes.acquire(system + chat + [16, 17])
    assert follow_up is lanes.lanes[0] and lanes.lanes[0].draft is None
    completion = lanes.acquire(code[:4] + [30, 31], fim=True)  # an editor's next completion: the file's start
    assert completion is lanes.lanes[1]
    lanes.release(follow_up)
    lanes.release(completion)
    # A new conversation that shares the system prompt (most of the chat's cache) keeps the chat: it
    # takes the empty lane.
    assert lanes.acquire(system + chat[:2] + [40]) is lanes.lanes[2]
    # With no free lane empty or continued, the one where it keeps most and throws away least.
    assert lanes.acquire([60, 61, 70]) is lanes.lanes[3]


def test_a_request_that_continues_a_busy_lane_waits_for_it_rather_than_read_its_prompt_again():
    """A client sends its next request as soon as the last event of the one before arrives, before that
    request's thread lets its lane go: the follow-up waits for its own lane (bounded), not an empty one."""
    lanes = Lanes(_Views(), None, 2)
    code = [20, 21, 22, 23, 24, 25, 26, 27]
    _hold(lanes.lanes[0], code, fim=True)
    running = lanes.acquire(code[:-2], fim=True)  # the completion before, still holding its lane
    assert running is lanes.lanes[0]
    taken: list = []
    follower = threading.Thread(target=lambda: taken.append(lanes.acquire(code[:5] + [30, 31], fim=True)))
    follower.start()
    time.sleep(0.2)
    assert not taken  # it waits for the lane its prompt continues ...
    lanes.release(running)
    follower.join(timeout=5)
    assert taken == [lanes.lanes[0]]  # ... and takes it once let go
    # A busy lane that is not let go in time: the request goes on elsewhere, CONTINUE_WAIT later.
    started = time.monotonic()
    other = lanes.acquire(code[:5] + [40], fim=True)
    assert other is lanes.lanes[1] and CONTINUE_WAIT <= time.monotonic() - started < CONTINUE_WAIT + 2
    lanes.release(other)
    lanes.release(lanes.lanes[0])
    # Nothing busy that it continues: no wait at all.
    started = time.monotonic()
    assert lanes.acquire([90, 91, 92]) is not None and time.monotonic() - started < 0.5


def test_the_default_takes_what_half_the_free_memory_holds_from_two_to_four():
    mib = 2**20
    assert default_parallel(160 * mib, 8192 * mib) == 4
    assert default_parallel(160 * mib, 1000 * mib) == 3
    assert default_parallel(160 * mib, 100 * mib) == 2  # at least two
    assert default_parallel(160 * mib, None) == 2
