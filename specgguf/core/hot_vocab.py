"""A draft with a hot vocabulary, seen by the loop as a model over the verifier's whole vocabulary.

The draft file scores only its kept tokens (files/hot_vocab.py). Here its logits go back to the
full vocabulary with −inf everywhere else, so its distribution q is zero outside the hot set and
the acceptance rule, untouched, stays exact: where the verifier wants a token the draft cannot
propose, the draft is rejected there and the verifier's token is drawn from max(0, p − q) = p.
Context tokens are read through `feed` (verifier id -> draft id), the near-miss map of the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .model import Model


class HotVocab:
    def __init__(self, model: Model, ids: np.ndarray, feed: np.ndarray):
        self.model = model
        self.ids = ids  # draft id -> verifier id
        self.feed = feed  # verifier id -> draft id
        self.n_vocab = len(feed)
        self.n_ctx = model.n_ctx
        self.cached: list[int] = []  # verifier ids, as the loop sees them
        self._pending: list[int] = []  # a tree's tokens, until keep_path

    def __getattr__(self, name: str) -> Any:  # path, n_threads, close, ...: the file's own
        return getattr(self.model, name)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def _full(self, logits: np.ndarray) -> np.ndarray:
        full = np.full((logits.shape[0], self.n_vocab), -np.inf, dtype=logits.dtype)
        full[:, self.ids] = logits
        return full

    def _draft_ids(self, tokens: Sequence[int]) -> list[int]:
        return self.feed[np.asarray(tokens, dtype=np.int64)].tolist()

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        logits = self.model.eval(self._draft_ids(tokens), n_logits=n_logits)
        self.cached.extend(tokens)
        return self._full(logits)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        logits = self.model.eval_tree(self._draft_ids(tokens), parents, n_logits=n_logits)
        self._pending = list(tokens)
        return self._full(logits)

    def keep_path(self, path: Sequence[int]) -> None:
        self.model.keep_path(path)
        self.cached.extend(self._pending[node] for node in path)
        self._pending = []

    def rewind(self, n_past: int) -> None:
        self.model.rewind(n_past)
        del self.cached[n_past:]

    def clear(self) -> None:
        """Empty the whole cache (LlamaModel's `clear`, beyond the protocol; else a rewind)."""
        clear = getattr(self.model, "clear", None)
        if clear is not None:
            clear()
        else:
            self.model.rewind(0)
        self.cached.clear()

    def is_eog(self, token: int) -> bool:
        draft_id = int(self.feed[token])
        return int(self.ids[draft_id]) == token and self.model.is_eog(draft_id)
