"""Fill in the middle: llama-server's /infill (llama.vscode's request), OpenAI's `suffix`, Ollama's
`suffix`, the prompt's framing, and the n_indent rule."""

from __future__ import annotations

import json

import ollama
import pytest

from live_server import live_server
from specgguf.conversation import FimRequest, fill_in_middle
from specgguf.serve.text import AnswerText
from tiny_gguf import tiny_vocab, write_tiny_llama

# --- the framing, against llama-server's format_infill -------------------------------------


class CharPrompts:
    """Each character a token (its code point), no BOS."""

    bos: list[int] = []

    def continuation(self, text, *, special=True):
        return [ord(c) for c in text]


PRE, SUF, MID, SEP, REP = 10**6 + 10, 10**6 + 11, 10**6 + 12, 10**6 + 20, 10**6 + 21


class Framing:
    def __init__(self, sep=-1, rep=-1):
        self.prefix, self.suffix, self.middle, self.sep, self.rep = PRE, SUF, MID, sep, rep


def _text(tokens):
    return "".join(chr(t) if t < 10**6 else f"[{t - 10**6}]" for t in tokens)


def test_fim_framing_places_extra_chunks_as_llama_server_does():
    fim = FimRequest("def f(", "):\n", (("a.py", "x=1"), ("b.py", "y=2")), prompt="n")
    repo_level = fill_in_middle(CharPrompts(), fim, Framing(sep=SEP, rep=REP), n_ctx=4096, n_predict=64)
    assert _text(repo_level) == ("[21]myproject\n[20]a.py\nx=1[20]b.py\ny=2[20]filename\n[10]def f(n[11]):\n[12]")
    plain = fill_in_middle(CharPrompts(), fim, Framing(), n_ctx=4096, n_predict=64)
    assert _text(plain) == "\n\n--- snippet ---\n\nx=1\n\n--- snippet ---\n\ny=2[10]def f(n[11]):\n[12]"


def test_fim_framing_keeps_the_prefixs_end_the_suffixs_start_and_the_newest_extra():
    fim = FimRequest("p" * 500 + "END", "START" + "s" * 500, (("f", "e" * 400 + "LAST"),))
    tokens = fill_in_middle(CharPrompts(), fim, Framing(sep=SEP), n_ctx=600, n_predict=10, n_batch=256)
    prefix, suffix = tokens[tokens.index(PRE) + 1 : tokens.index(SUF)], tokens[tokens.index(SUF) + 1 : -1]
    assert len(prefix) == 192 and _text(prefix).endswith("END")  # 3/4 of the batch, from the end
    assert len(suffix) == 62 and _text(suffix).startswith("START")  # a quarter, less 2, from the start
    extra = tokens[: tokens.index(PRE)]
    assert len(extra) == 600 - 256 - 2 * 10 and _text(extra).endswith("LAST[20]filename\n")  # the newest part


def test_n_indent_ends_the_middle_at_a_line_indented_less():
    token_text = {i: chr(i).encode() for i in range(128)}
    answer = AnswerText(token_text.__getitem__, [], n_indent=4)
    shown = answer.add([ord(c) for c in "x = 1\n    y = 2\n  z"]) + answer.finish()
    assert shown == "x = 1\n    y = 2\n  " and answer.stopped
    blank_first_line = AnswerText(token_text.__getitem__, [], n_indent=4)
    assert blank_first_line.add([ord(c) for c in "\nreturn"]) == "\n"  # the line after the first new line
    assert blank_first_line.stopped


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    n = len(tiny_vocab())
    texts = {n - 3: "<|fim_prefix|>", n - 2: "<|fim_suffix|>", n - 1: "<|fim_middle|>"}
    return write_tiny_llama(tmp_path_factory.mktemp("fim") / "coder.gguf", base_seed=7, token_text_override=texts)


@pytest.fixture(scope="module")
def server(fim_model):
    with live_server("-m", fim_model, "--drafter", "ngram", "-k", "4", "-c", "1024", "-t", "1", "-n", "16") as live:
        yield live


LLAMA_VSCODE = {
    "id_slot": 0,
    "input_prefix": "def add(a, b):\n    ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
    "prompt": "return",
    "n_predict": 12,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "n_indent": 4,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
}


def test_a_llama_vscode_request_gets_the_middle(server):
    with server.http() as http:
        whole = http.post("/infill", json=LLAMA_VSCODE).json()
        assert whole["stop"] is True and isinstance(whole["content"], str)
        assert whole["stop_type"] in ("eos", "limit") and whole["tokens_predicted"] <= 12
        assert whole["timings"]["prompt_n"] + whole["timings"]["cache_n"] == whole["tokens_evaluated"]
        fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"]
        picked = http.post("/infill", json={**LLAMA_VSCODE, "response_fields": fields}).json()
        assert set(picked) == set(fields)
        # llama-server's `samplers` name the samplers on: greedy needs "temperature" among them (at 0).
        greedy = {"temperature": 0, "samplers": ["top_k", "top_p", "temperature"]}
        again = http.post("/infill", json={**LLAMA_VSCODE, "response_fields": fields, **greedy}).json()
        assert again["timings/prompt_n"] < 10  # the same prompt: read from the cache
        warm_up = http.post("/infill", json={**LLAMA_VSCODE, "n_predict": 0}).json()
        assert warm_up["content"] == ""  # llama.vim's warm-up: the prompt read, nothing answered
        with http.stream("POST", "/infill", json={**LLAMA_VSCODE, "stream": True, **greedy}) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1]["stop"] is True and not any(event["stop"] for event in events[:-1])
        assert "".join(event["content"] for event in events) == again["content"]


def test_openai_and_ollama_suffix_completions_fill_the_middle(server):
    prefix, suffix = "def add(a, b):\n    return", "\n\nprint(add(1, 2))\n"
    openai_answer = server.client().completions.create(
        model="coder", prompt=prefix, suffix=suffix, max_tokens=8, temperature=0
    )
    infill = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 8, "temperature": 0}
    with server.http() as http:
        assert http.post("/infill", json=infill).json()["content"] == openai_answer.choices[0].text
    ollama_answer = ollama.Client(host=server.base_url).generate(
        model="coder", prompt=prefix, suffix=suffix, options={"temperature": 0, "num_predict": 8}
    )
    assert ollama_answer.response == openai_answer.choices[0].text


def test_models_without_fim_tokens_and_bad_bodies_get_400s(tiny_verifier, server):
    with server.http() as http:
        for body in ({"input_prefix": 5}, {"input_extra": "x"}, {"mirostat": 2}, {"n_predict": -5}, {"nope": 1}):
            response = http.post("/infill", json=body)
            assert response.status_code == 400, response.text
            assert set(response.json()["error"]) == {"code", "message", "type"}
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "4") as plain, plain.http() as http:
        refused = http.post("/infill", json=LLAMA_VSCODE)
        assert refused.status_code == 400 and "fill-in-the-middle" in refused.json()["error"]["message"]
        suffix = http.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
        assert suffix.status_code == 400 and "fill-in-the-middle" in suffix.json()["error"]["message"]
        assert http.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 2}).status_code == 200


def test_an_infill_between_chat_turns_leaves_the_parked_chat_in_its_slot(fim_model):
    """The editor-plus-chat case --cache-slots is for: a FIM request resets only the live cache's
    text memory; the chat it parked is restored for its next turn (it cleared every slot)."""
    args = ("-m", fim_model, "--drafter", "ngram", "-k", "4", "-c", "1024", "-t", "1", "--cache-slots", "2", "-np", "1")
    with live_server(*args) as live, live.http() as http:
        client = live.client()
        messages = [{"role": "user", "content": "the cat and the dog"}]
        first = client.chat.completions.create(model="coder", messages=messages, max_tokens=6, temperature=0)
        assert http.post("/infill", json={**LLAMA_VSCODE, "temperature": 0}).status_code == 200
        messages += [{"role": "assistant", "content": first.choices[0].message.content}]
        messages += [{"role": "user", "content": "and then?"}]
        second = client.chat.completions.create(model="coder", messages=messages, max_tokens=6, temperature=0)
    assert first.usage is not None and second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


@pytest.mark.qwen
def test_ngram_drafts_learn_from_the_extra_chunks_with_the_default_pair(qwen_pair):
    verifier, _ = qwen_pair
    chunk = "def area(width, height):\n    return width * height\n"
    body = {
        "input_prefix": "# geometry.py\n",
        "input_suffix": "\n",
        "input_extra": [{"filename": "shapes.py", "text": chunk * 2}],
        "prompt": "def area(width, height):\n",
        "n_predict": 12,
        "temperature": 0,
    }
    with (
        live_server("-m", verifier, "--drafter", "ngram", "-k", "6", "-c", "1024", "-t", "2") as live,
        live.http() as http,
    ):
        answer = http.post("/infill", json=body).json()
    assert answer["content"].startswith("    return width * height")
    assert answer["tokens_evaluated"] > 40  # the chunk is in the prompt
    assert answer["timings"]["draft_n_accepted"] >= 3  # drafted from the chunk: no draft model here
