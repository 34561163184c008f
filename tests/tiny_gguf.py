"""Write tiny random-weight LLaMA-architecture GGUF files for fast tests.

``write_tiny_llama`` produces a < 1 MB model that llama.cpp loads in milliseconds.
Weights come from ``base_seed``; ``noise > 0`` adds a small perturbation drawn from
``seed``, so two files sharing ``base_seed`` act as a closely matching draft/verifier
pair.  The vocabulary depends only on ``vocab_type`` (plus ``n_vocab`` and
``token_text_override``), never on the seeds.
"""

from __future__ import annotations

import pathlib
import zlib
from os import PathLike

import numpy as np
from gguf import GGUFWriter, TokenType

DEFAULT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIALS = ["<unk>", "<s>", "</s>"]
_WORDS = """the of and to a in is it you that he was for on are with as I his they be at
one have this from or had by hot word but what some we can out other were all there when
up use your how said an each she which do their time if will way about many then them
write would like so these her long make thing see him two has look more day could go come
did number sound no most people my over know water than call first who may down side been
now find any new work part take get place made live where after back little only round man
year came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell does
set three want air well also play small end put home read hand port large spell add even
land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head stand own
page should country found answer school grow study still learn plant cover food sun four
between state keep eye never last let thought city tree cross farm hard start might story
saw far sea draw left late run while press close night real life few north cat dog hello
ing ed er ly s es""".split()
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()"


def _gpt2_byte_chars() -> list[str]:
    """GPT-2 ``bytes_to_unicode``: printable stand-in character for every byte 0..255."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _spm_vocab() -> tuple[list[str], list[float], list[int], list[str]]:
    tokens = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    pieces: dict[str, None] = dict.fromkeys(["\u2581", *_CHARS])
    for w in _WORDS:
        for prefix in ("\u2581", ""):
            piece = prefix + w
            for i in range(2, len(piece) + 1):  # every prefix, so SPM merges can reach it
                pieces.setdefault(piece[:i])
    tokens += list(pieces)
    types += [TokenType.NORMAL] * len(pieces)
    # SPM merges the pair whose result has the highest score: favour longer pieces.
    scores = [0.0] * 259 + [-100.0 + len(p) - i * 1e-3 for i, p in enumerate(pieces)]
    return tokens, scores, [int(t) for t in types], []


def _bpe_vocab() -> tuple[list[str], list[float], list[int], list[str]]:
    byte_chars = _gpt2_byte_chars()
    tokens = list(SPECIALS) + byte_chars
    enc = {c: byte_chars[ord(c)] for c in _CHARS + " "}
    pieces: dict[str, None] = {}
    merges: dict[str, None] = {}
    for w in _WORDS:
        for word in (" " + w, w):
            sym = "".join(enc[c] for c in word)
            for i in range(2, len(sym) + 1):  # left-to-right merge chain: "Ġ t", "Ġt h", ...
                merges.setdefault(f"{sym[: i - 1]} {sym[i - 1]}")
                pieces.setdefault(sym[:i])
    tokens += [p for p in pieces if p not in byte_chars]
    types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3)
    return tokens, [0.0] * len(tokens), [int(t) for t in types], list(merges)


def tiny_vocab(vocab_type: str = "spm") -> list[str]:
    """The base (unpadded) token texts for ``vocab_type``."""
    return {"spm": _spm_vocab, "bpe": _bpe_vocab}[vocab_type]()[0]


def _weights(
    name: str, shape: tuple[int, ...], scale: float, *, base_seed: int, seed: int, noise: float, ones: bool = False
) -> np.ndarray:
    """One tensor; per-name RNG streams keep shared rows identical across vocab sizes."""
    key = zlib.crc32(name.encode())
    if ones:
        w = np.ones(shape)
    else:
        w = np.random.default_rng([base_seed, key]).standard_normal(shape) * scale
    if noise > 0:
        w = w + noise * scale * np.random.default_rng([seed, key, 1]).standard_normal(shape)
    return w.astype(np.float32)


def write_tiny_llama(
    path: str | PathLike[str],
    *,
    seed: int = 0,
    base_seed: int = 0,
    noise: float = 0.0,
    n_vocab: int | None = None,
    vocab_type: str = "spm",
    bos_id: int = 1,
    eos_id: int = 2,
    token_text_override: dict[int, str] | None = None,
    chat_template: str | None = DEFAULT_TEMPLATE,
    n_ctx_train: int = 512,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
) -> pathlib.Path:
    """Write a tiny random LLaMA GGUF to ``path`` and return it as a Path."""
    if vocab_type not in ("spm", "bpe"):
        raise ValueError(f"vocab_type must be 'spm' or 'bpe', not {vocab_type!r}")
    tokens, scores, types, merges = (_spm_vocab if vocab_type == "spm" else _bpe_vocab)()
    if n_vocab is not None:
        if n_vocab < 259:
            raise ValueError("n_vocab must keep the 3 specials and 256 byte tokens (>= 259)")
        extra = range(len(tokens), n_vocab)
        tokens = tokens[:n_vocab] + [f"<extra_{i}>" for i in extra]
        scores = scores[:n_vocab] + [-1e4] * len(extra)
        types = types[:n_vocab] + [int(TokenType.NORMAL)] * len(extra)
    for tid, text in (token_text_override or {}).items():
        tokens[tid] = text
        if types[tid] == TokenType.BYTE:  # else llama.cpp would parse the text as "<0xXX>"
            types[tid] = int(TokenType.NORMAL)
    known = set(tokens)  # drop merges whose parts or result were truncated/overridden
    merges = [m for m in merges if m.replace(" ", "") in known and all(p in known for p in m.split(" "))]
    if vocab_type == "bpe" and not merges:  # gguf-py drops empty arrays; llama.cpp requires merges
        raise ValueError("bpe vocab needs at least one merge: use n_vocab >= 260")

    nv, head_dim, n_ff = len(tokens), n_embd // n_head, 4 * n_embd
    path = pathlib.Path(path)
    w = GGUFWriter(str(path), "llama")
    w.add_name(f"tiny-llama-{vocab_type}")
    w.add_file_type(0)  # ALL_F32
    w.add_vocab_size(nv)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama" if vocab_type == "spm" else "gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if vocab_type == "bpe":
        w.add_token_merges(merges)
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    # numpy shape is (out, in); gguf-py reverses it to ggml's ne = [in, out] that llama.cpp expects.
    def add(name: str, shape: tuple[int, ...], scale: float = 1.0, ones: bool = False) -> None:
        w.add_tensor(name, _weights(name, shape, scale, base_seed=base_seed, seed=seed, noise=noise, ones=ones))

    add("token_embd.weight", (nv, n_embd))
    add("output_norm.weight", (n_embd,), ones=True)
    add("output.weight", (nv, n_embd), 0.5)  # logit std ~ 0.5*sqrt(n_embd) = 4: peaked, not degenerate
    for i in range(n_layer):
        b, s_in, s_ff = f"blk.{i}.", n_embd**-0.5, n_ff**-0.5
        add(b + "attn_norm.weight", (n_embd,), ones=True)
        add(b + "ffn_norm.weight", (n_embd,), ones=True)
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(b + t + ".weight", (n_embd, n_embd), s_in)
        add(b + "ffn_gate.weight", (n_ff, n_embd), s_in)
        add(b + "ffn_up.weight", (n_ff, n_embd), s_in)
        add(b + "ffn_down.weight", (n_embd, n_ff), s_ff)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
