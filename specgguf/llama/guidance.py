"""llguidance's tokenizer for a loaded GGUF: the vocabulary exactly as llama.cpp tokenizes it, with every
end-of-generation token as the grammar's end (built once per model, about a second for 150k tokens)."""

from __future__ import annotations

import threading
import warnings
import weakref

import llama_cpp
from llguidance import LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab

from .model import LlamaModel

_TOKENIZERS: weakref.WeakKeyDictionary[LlamaModel, LLTokenizer] = weakref.WeakKeyDictionary()
_TEXTS: weakref.WeakKeyDictionary[LlamaModel, list[bytes]] = weakref.WeakKeyDictionary()
_BUILDING = threading.RLock()  # one build per model: a request that needs a table meanwhile waits for it


def grammar_tables(model: LlamaModel) -> None:
    """Build both tables now (serve, while it waits for its first request: about 2 s for Qwen's 151k
    tokens that would otherwise fall on the first tool call's time to first token)."""
    guidance_tokenizer(model)
    token_texts(model)


def guidance_tokenizer(model: LlamaModel) -> LLTokenizer:
    """The model's vocabulary for llguidance (cached per model)."""
    with _BUILDING:
        if model not in _TOKENIZERS:
            vocab = model._vocab  # noqa: SLF001 - the wing's own model
            eog = [token for token in range(model.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, token)]
            with warnings.catch_warnings():  # it calls llama_token_get_attr, deprecated in llama-cpp-python
                warnings.simplefilter("ignore", DeprecationWarning)
                _TOKENIZERS[model] = lltokenizer_from_vocab(vocab, n_vocab=model.n_vocab, eos_token=eog or None)
        return _TOKENIZERS[model]


def token_texts(model: LlamaModel) -> list[bytes]:
    """Each token's bytes, by id (cached per model): what core/json_digits.py reads numbers from."""
    with _BUILDING:
        if model not in _TEXTS:
            _TEXTS[model] = [model.token_bytes(token) for token in range(model.n_vocab)]
        return _TEXTS[model]
