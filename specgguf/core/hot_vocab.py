"""A draft with a hot vocabulary, seen by the loop as a model over the verifier's whole vocabulary.

The draft file scores only its kept tokens (files/hot_vocab.py). Here its logits go back to the
full vocabulary with −inf everywhere else, so its distribution q is zero outside the hot set and
the acceptance rule, untouched, stays exact: where the verifier wants a token the draft cannot
propose, the draft is rejected there and the verifier's token is drawn from max(0, p − q) = p.
A context token outside the hot set is fed as its own embedding row (`rows`, the whole table of
the file it was cut from) through the model's `eval_embeddings`, so the draft reads the text as it
is; a tree's batch, or a model without rows, reads it through `feed` (verifier id -> draft id), the
file's near-miss map. The server's cache slots park and restore it through `save_state` and
`load_state`, which keep the file's cache and this view's token list together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .model import Model


class HotVocab:
    def __init__(
        self,
        model: Model,
        ids: np.ndarray,
        feed: np.ndarray,
        rows: Callable[[list[int]], np.ndarray] | None = None,
    ):
        self.model = model
        self.ids = ids  # draft id -> verifier id
        self.feed = feed  # verifier id -> draft id
        self.rows = rows if hasattr(model, "eval_embeddings") else None  # verifier ids -> embedding rows
        self.n_fed_rows = 0  # context tokens fed as embedding rows (stats, tests)
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
        draft_ids = self._draft_ids(tokens)
        n_cold = 0 if self.rows is None else int((self.ids[draft_ids] != np.asarray(tokens)).sum())
        if n_cold:  # the whole call as embedding rows: a batch holds tokens or rows, not both
            rows = self.rows(list(tokens))  # type: ignore[misc]
            logits = self.model.eval_embeddings(draft_ids, rows, n_logits=n_logits)  # type: ignore[attr-defined]
            self.n_fed_rows += n_cold
        else:
            logits = self.model.eval(draft_ids, n_logits=n_logits)
        self.cached.extend(tokens)
        return self._full(logits)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        logits = self.model.eval_tree(self._draft_ids(tokens), parents, n_logits=n_logits)
        self._pending = list(tokens)
        return self._full(logits)

    def keep_path(self, path: Sequence[int]) -> None:
        self.model.keep_path(path)  # which may keep a prefix of the path only (`Model.keep_path`)
        self.cached.extend(self._pending[node] for node in path[: self.model.n_past - len(self.cached)])
        self._pending = []

    def rewind(self, n_past: int) -> None:
        self.model.rewind(n_past)
        del self.cached[n_past:]

    def save_state(self) -> tuple[bytes, list[int]]:
        """The file's saved cache (its own `save_state`), with the tokens as the loop sees them."""
        state, _ = self.model.save_state()  # type: ignore[attr-defined]  # LlamaModel's, beyond the protocol
        return state, list(self.cached)

    def load_state(self, state: bytes, tokens: list[int]) -> None:
        """Restore what `save_state` gave: the file's cache under its own ids, this view's token list."""
        self.model.load_state(state, self._draft_ids(tokens))  # type: ignore[attr-defined]
        self.cached = list(tokens)
        self._pending = []

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
