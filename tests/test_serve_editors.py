"""What editors send, body for body as their sources write it (llama.vscode's src/llama-server.ts,
llama.vim's autoload/llama.vim), against a live server on a tiny code model; llama-server's other
request fields (`samplers` applied, the rest accepted, or refused by name); a completions prompt
read as the model's raw input (FIM marker texts become the FIM tokens); a context overflow's code."""

from __future__ import annotations

import json

import openai
import pytest

from live_server import live_server
from specgguf.core.sampling import Penalties, SamplingSettings
from specgguf.serve.common import ApiError, samplers_on
from tiny_gguf import tiny_vocab, write_tiny_llama

FIM_TEXTS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """A tiny BPE model with Qwen-Coder's FIM tokens (BPE: no space is put after a special token,
    so /infill's framing and the tokenizer's reading of the marker texts agree token for token)."""
    n = len(tiny_vocab("bpe"))
    texts = dict(zip(range(n - 3, n), FIM_TEXTS, strict=True))
    path = tmp_path_factory.mktemp("editors") / "coder.gguf"
    return write_tiny_llama(path, base_seed=11, vocab_type="bpe", token_text_override=texts)


@pytest.fixture(scope="module")
def server(coder):
    with live_server("-m", coder, "--drafter", "ngram", "-k", "4", "-c", "512", "-t", "1", "-n", "16") as live:
        yield live


PREFIX, SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
CHUNKS_VSCODE = [{"text": "def sub(a, b):\n    return a - b\n", "time": 1733070000123, "filename": "/src/util.py"}]
CHUNKS_VIM = [{"text": "def sub(a, b):\n    return a - b\n", "time": [1733070000, 123456], "filename": "util.py"}]
MESSAGES = [
    {"role": "system", "content": "You are an expert coder."},
    {"role": "user", "content": "Modify the code: the cat and the dog"},
]

# llama.vscode 0.0.63, createRequestPayload (a completion, and the extra context sent ahead).
VSCODE_FIM = {
    "id_slot": 0,
    "input_prefix": PREFIX,
    "input_suffix": SUFFIX,
    "input_extra": CHUNKS_VSCODE,
    "prompt": "    return",
    "n_predict": 12,
    "n_cmpl": 3,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "n_indent": 4,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 500,
}
VSCODE_PREPARE = {
    "id_slot": 0,
    "input_prefix": "",
    "input_suffix": "",
    "input_extra": CHUNKS_VSCODE,
    "prompt": "",
    "n_predict": 0,
    "samplers": [],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1,
}
# llama.vscode before 0.0.20's agent (createChatEditRequestPayload): llama-server's whole sampler set.
VSCODE_CHAT_EDIT = {
    "messages": MESSAGES,
    "stream": False,
    "cache_prompt": True,
    "samplers": "edkypmxt",
    "temperature": 0.8,
    "dynatemp_range": 0,
    "dynatemp_exponent": 1,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "typical_p": 1,
    "xtc_probability": 0,
    "xtc_threshold": 0.1,
    "repeat_last_n": 64,
    "repeat_penalty": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "dry_multiplier": 0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "max_tokens": -1,
    "timings_per_token": False,
}
# llama.vim: llama#fim, s:ring_update (the extra context sent ahead), llama#inst (its warm-up) and llama#inst_send.
VIM_FIELDS = ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"]
VIM_FIM = {
    "id_slot": 0,
    "input_prefix": PREFIX,
    "input_suffix": SUFFIX,
    "input_extra": CHUNKS_VIM,
    "prompt": "    return",
    "n_predict": 12,
    "stop": [],
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.90,
    "samplers": ["top_k", "top_p", "infill"],
    "stream": False,
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": VIM_FIELDS,
}
VIM_RING = {
    "id_slot": 0,
    "input_prefix": "",
    "input_suffix": "",
    "input_extra": CHUNKS_VIM,
    "prompt": "",
    "n_predict": 0,
    "temperature": 0.0,
    "samplers": [],
    "stream": False,
    "cache_prompt": True,
    "t_max_prompt_ms": 1,
    "t_max_predict_ms": 1,
    "response_fields": [""],
}
VIM_INST_WARM_UP = {
    "id_slot": 0,
    "messages": MESSAGES,
    "samplers": [],
    "n_predict": 0,
    "stream": False,
    "cache_prompt": True,
    "response_fields": [""],
}
VIM_INST = {
    "id_slot": 1,
    "messages": MESSAGES,
    "min_p": 0.1,
    "temperature": 0.1,
    "samplers": ["min_p", "temperature"],
    "stream": True,
    "cache_prompt": True,
}


def test_llama_vscodes_bodies_get_answers(server):
    with server.http() as http:
        prepared = http.post("/infill", json=VSCODE_PREPARE)
        assert prepared.status_code == 200, prepared.text
        assert prepared.json()["content"] == ""
        completions = http.post("/infill", json=VSCODE_FIM)
        assert completions.status_code == 200, completions.text
        alternatives = completions.json()  # n_cmpl 3: a list, as llama-server answers (llama.vscode reads both)
        assert [answer["index"] for answer in alternatives] == [0, 1, 2]
        assert all(answer["stop"] and answer["tokens_predicted"] <= 12 for answer in alternatives)
        assert all(isinstance(answer["content"], str) for answer in alternatives)
        edit = http.post("/v1/chat/completions", json=VSCODE_CHAT_EDIT)
        assert edit.status_code == 200, edit.text
        assert isinstance(edit.json()["choices"][0]["message"]["content"], str)
        assert 0 < edit.json()["usage"]["completion_tokens"] <= 16  # max_tokens -1: the server's -n


def test_llama_vims_bodies_get_answers(server):
    with server.http() as http:
        assert http.post("/infill", json=VIM_RING).status_code == 200
        completion = http.post("/infill", json=VIM_FIM)
        assert completion.status_code == 200, completion.text
        assert set(completion.json()) == set(VIM_FIELDS)
        warm_up = http.post("/v1/chat/completions", json=VIM_INST_WARM_UP)
        assert warm_up.status_code == 200, warm_up.text
        assert warm_up.json()["choices"][0]["message"]["content"] == ""
        assert warm_up.json()["usage"]["completion_tokens"] == 0
        with http.stream("POST", "/v1/chat/completions", json=VIM_INST) as response:
            assert response.status_code == 200, response.read()
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(line) for line in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
        assert text and chunks[-1]["timings"]["predicted_n"] > 0


def test_samplers_name_the_samplers_that_are_on():
    settings = SamplingSettings(temperature=0.2, top_k=20, top_p=0.9, min_p=0.1, penalties=Penalties(repeat=1.3))
    editor = samplers_on(settings, ["top_k", "top_p", "infill"])  # no temperature: the logits as they are
    assert (editor.temperature, editor.top_k, editor.top_p, editor.min_p) == (1.0, 20, 0.9, 0.0)
    assert editor.penalties == Penalties(bias=())
    assert samplers_on(settings, "edkypmxt") == settings  # llama-server's codes: every sampler
    assert samplers_on(settings, ["min_p", "temp"]) == SamplingSettings(
        temperature=0.2, top_k=0, top_p=1.0, min_p=0.1, penalties=Penalties(bias=())
    )
    with pytest.raises(ApiError, match="unknown sampler 'top_q'"):
        samplers_on(settings, ["top_q"])


def test_samplers_turn_off_over_http_what_they_do_not_name(server):
    """llama.vscode's `samplers` leave out "temperature": its `temperature` 0 is then not read, the
    logits are sampled as they are, the same seeded answer as temperature 1."""
    base = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "seed": 5}
    base |= {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    with server.http() as http:
        unnamed = http.post("/infill", json={**base, "temperature": 0, "samplers": ["top_k", "top_p", "infill"]})
        at_one = http.post("/infill", json={**base, "temperature": 1.0})
        greedy = http.post("/infill", json={**base, "temperature": 0})
    assert unnamed.json()["content"] == at_one.json()["content"] != greedy.json()["content"]


def test_fields_that_would_change_the_answer_and_typos_are_refused_by_name(server):
    refused = {
        "dry_multiplier": 0.8,
        "xtc_probability": 0.5,
        "typical_p": 0.9,
        "mirostat": 2,
        "dynatemp_range": 0.5,
        "lora": [{"id": 0, "scale": 0.5}],
        "samplers": ["top_q"],
        "dry_allowed_lenght": 2,  # a typo of a field llama-server has
    }
    with server.http() as http:
        for name, value in refused.items():
            for path, body in (("/infill", {"input_prefix": "x"}), ("/v1/chat/completions", {"messages": MESSAGES})):
                response = http.post(path, json={**body, name: value})
                assert response.status_code == 400, (path, name, response.text)
                assert name in response.json()["error"]["message"]


def test_a_completions_prompt_reads_fim_marker_texts_as_the_fim_tokens(server, coder):
    import llama_cpp

    text = f"{FIM_TEXTS[0]}{PREFIX}{FIM_TEXTS[1]}{SUFFIX}{FIM_TEXTS[2]}"
    vocab = llama_cpp.Llama(str(coder), vocab_only=True, verbose=False)
    special = vocab.tokenize(text.encode(), special=True)
    assert len(special) < len(vocab.tokenize(text.encode(), special=False))
    client, greedy = server.client(), {"max_tokens": 8, "temperature": 0}
    as_text = client.completions.create(model="coder", prompt=text, **greedy)
    as_ids = client.completions.create(model="coder", prompt=special, **greedy)
    with server.http() as http:
        infill = http.post(
            "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "temperature": 0}
        )
    assert (
        as_text.usage.prompt_tokens == as_ids.usage.prompt_tokens == len(special) == infill.json()["tokens_evaluated"]
    )
    assert as_text.choices[0].text == as_ids.choices[0].text == infill.json()["content"]


def test_chat_content_with_fim_marker_texts_stays_text(server, coder):
    import llama_cpp

    marked = f"{FIM_TEXTS[0]}{PREFIX}{FIM_TEXTS[1]}{SUFFIX}{FIM_TEXTS[2]}"
    vocab = llama_cpp.Llama(str(coder), vocab_only=True, verbose=False)
    client = server.client()
    plain = client.chat.completions.create(model="coder", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    with_markers = client.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "x" + marked}], max_tokens=1
    )
    n_marked_as_text = len(vocab.tokenize(("x" + marked).encode(), special=False)) - len(vocab.tokenize(b"x"))
    assert with_markers.usage.prompt_tokens - plain.usage.prompt_tokens == n_marked_as_text


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model="coder", prompt="the cat " * 400, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model="coder", messages=[{"role": "user", "content": "the cat " * 400}], max_tokens=4
        )
    for error in (completion.value, chat.value):
        assert error.code == "context_length_exceeded" and "context holds 512" in error.message
