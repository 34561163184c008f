"""Fast checks that tiny_gguf writes GGUF files llama.cpp loads and runs as expected."""

from __future__ import annotations

import pathlib
import warnings
from typing import Any

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from tiny_gguf import DEFAULT_TEMPLATE, tiny_vocab, write_tiny_llama

TEXT = b"hello world the cat"


def load(path: pathlib.Path, **kw: Any) -> Llama:
    return Llama(model_path=str(path), n_ctx=256, verbose=False, **kw)


def greedy(llm: Llama, prompt: list[int], n: int = 20) -> list[int]:
    out: list[int] = []
    for tok in llm.generate(prompt, temp=0.0):
        out.append(tok)
        if len(out) == n:
            break
    llm.reset()
    return out


def token_text(llm: Llama, tid: int) -> bytes:
    return llama_cpp.llama_vocab_get_text(llama_cpp.llama_model_get_vocab(llm.model), tid)


@pytest.mark.parametrize("vocab_type", ["spm", "bpe"])
def test_loads_tokenizes_and_generates(tmp_path: pathlib.Path, vocab_type: str) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", vocab_type=vocab_type)
    assert path.stat().st_size < 5_000_000
    llm = load(path)
    assert llm.n_vocab() == len(tiny_vocab(vocab_type))
    toks = llm.tokenize(TEXT)
    assert toks[0] == llm.token_bos() == 1
    assert 4 <= len(toks) <= 12  # word pieces, not one byte token per character
    assert llm.detokenize(toks[1:]).strip() == TEXT
    out = greedy(llm, toks, 20)
    assert len(out) == 20 and all(0 <= t < llm.n_vocab() for t in out)
    assert len(set(out)) >= 8, f"degenerate greedy output: {out}"


def test_vocab_is_seed_independent_and_byte_fallback_works(tmp_path: pathlib.Path) -> None:
    a = load(write_tiny_llama(tmp_path / "a.gguf", base_seed=1))
    b = load(write_tiny_llama(tmp_path / "b.gguf", base_seed=2, seed=3, noise=0.1))
    assert [token_text(a, i) for i in range(a.n_vocab())] == [token_text(b, i) for i in range(b.n_vocab())]
    assert token_text(a, 3 + 0xC3) == b"<0xC3>"
    assert a.tokenize("é".encode(), add_bos=False)[-2:] == [3 + 0xC3, 3 + 0xA9]


@pytest.mark.parametrize("vocab_type", ["spm", "bpe"])
@pytest.mark.parametrize("delta", [200, -100])
def test_n_vocab_pads_or_truncates(tmp_path: pathlib.Path, vocab_type: str, delta: int) -> None:
    base = len(tiny_vocab(vocab_type))
    llm = load(write_tiny_llama(tmp_path / "m.gguf", vocab_type=vocab_type, n_vocab=base + delta))
    assert llm.n_vocab() == base + delta
    if delta > 0:
        assert token_text(llm, base + delta - 1) == f"<extra_{base + delta - 1}>".encode()
    ref = load(write_tiny_llama(tmp_path / "ref.gguf", vocab_type=vocab_type))
    shared = range(min(base, base + delta))
    assert [token_text(llm, i) for i in shared] == [token_text(ref, i) for i in shared]
    assert len(greedy(llm, llm.tokenize(TEXT), 5)) == 5


@pytest.mark.parametrize("vocab_type", ["spm", "bpe"])
def test_token_text_override(tmp_path: pathlib.Path, vocab_type: str) -> None:
    ref = load(write_tiny_llama(tmp_path / "ref.gguf", vocab_type=vocab_type))
    llm = load(
        write_tiny_llama(tmp_path / "m.gguf", vocab_type=vocab_type, token_text_override={42: "zzq", 400: "qqz"})
    )
    assert token_text(llm, 42) == b"zzq" != token_text(ref, 42)
    with warnings.catch_warnings():  # deprecated alias of llama_vocab_get_text
        warnings.simplefilter("ignore", DeprecationWarning)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        assert llama_cpp.llama_token_get_text(vocab, 400) == b"qqz"
    assert llm.detokenize([42, 400]) == b"zzqqqz"
    assert token_text(llm, 41) == token_text(ref, 41)


def test_special_ids_and_chat_template(tmp_path: pathlib.Path) -> None:
    llm = load(write_tiny_llama(tmp_path / "a.gguf", bos_id=5, eos_id=6, chat_template=None))
    assert (llm.token_bos(), llm.token_eos()) == (5, 6)
    assert llm.tokenize(b"the")[0] == 5
    assert "tokenizer.chat_template" not in llm.metadata
    llm = load(write_tiny_llama(tmp_path / "b.gguf"))
    assert llm.metadata["tokenizer.chat_template"] == DEFAULT_TEMPLATE
    reply = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert isinstance(reply, dict)  # not streamed
    assert reply["choices"][0]["finish_reason"] in ("length", "stop")


def argmax_along(llm: Llama, seq: list[int]) -> np.ndarray:
    """Greedy next-token prediction at every position of ``seq`` (teacher forcing)."""
    llm.reset()
    llm.eval(seq)
    return np.argmax(np.asarray(llm.scores[: len(seq)]), axis=1)


def test_noise_gives_partial_greedy_agreement(tmp_path: pathlib.Path) -> None:
    verifier = load(write_tiny_llama(tmp_path / "v.gguf", base_seed=7), logits_all=True)
    twin_path = write_tiny_llama(tmp_path / "t.gguf", base_seed=7, seed=99, noise=0.0)
    assert twin_path.read_bytes() == (tmp_path / "v.gguf").read_bytes()  # noise=0 ignores seed
    draft = load(write_tiny_llama(tmp_path / "d.gguf", base_seed=7, seed=1, noise=0.05), logits_all=True)
    agree = []
    for prompt in (TEXT, b"the old man said that he", b"one day a boy and his dog"):
        toks = verifier.tokenize(prompt)
        seq = toks + greedy(verifier, toks, 40)
        v, d = argmax_along(verifier, seq), argmax_along(draft, seq)
        assert list(v[len(toks) - 1 : -1]) == seq[len(toks) :]  # eval path matches generate()
        agree.append(np.mean(v[len(toks) - 1 :] == d[len(toks) - 1 :]))
    rate = float(np.mean(agree))
    assert 0.5 < rate < 0.98, rate
