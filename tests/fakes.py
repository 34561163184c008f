"""A fake model with scripted logits that keeps a real token cache, for engine tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


class FakeModel:
    """Implements the engine's `Model` protocol.

    `next_logits(context)` gives the logits after a context; the cache is a plain
    list, so tests can check exactly what each model saw and what was rolled back.
    """

    def __init__(
        self, next_logits: Callable[[list[int]], np.ndarray], *, n_vocab: int, n_ctx: int = 256, eog: Sequence[int] = ()
    ):
        self.next_logits = next_logits
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.eog = set(eog)
        self.cached: list[int] = []  # a plain attribute, as the protocol declares it
        self.eval_calls: list[list[int]] = []
        self.tree_calls: list[tuple[list[int], list[int]]] = []  # trees (not chains) evaluated
        self.pending_tree: tuple[int, list[int], list[int]] | None = None

    @property
    def cache(self) -> list[int]:  # the name test_engine.py reads
        return self.cached

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        self.eval_calls.append(tokens)
        self.cached += tokens
        if len(self.cached) > self.n_ctx:
            raise AssertionError(f"context overflow: {len(self.cached)} > {self.n_ctx}")
        ends = range(len(self.cached) - n_logits + 1, len(self.cached) + 1)
        return np.array([self.next_logits(self.cached[:end]) for end in ends]).reshape(n_logits, self.n_vocab)

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        assert all(-1 <= parent < i for i, parent in enumerate(parents)), parents
        base = len(self.cached)
        self.pending_tree = (base, tokens, list(parents))
        if list(parents) == list(range(-1, len(tokens) - 1)):  # a chain: appended as `eval` does
            return self.eval(tokens, n_logits=n_logits)
        self.tree_calls.append((tokens, list(parents)))
        if base + len(tokens) > self.n_ctx:
            raise AssertionError(f"context overflow: {base} + {len(tokens)} > {self.n_ctx}")
        paths: list[list[int]] = []
        for token, parent in zip(tokens, parents):
            paths.append((paths[parent] if parent >= 0 else []) + [token])
        rows = [self.next_logits(self.cached + path) for path in paths[len(tokens) - n_logits :]]
        return np.array(rows).reshape(n_logits, self.n_vocab)

    def keep_path(self, path: Sequence[int]) -> None:
        assert self.pending_tree is not None, "keep_path without a pending tree"
        base, tokens, parents = self.pending_tree
        self.pending_tree = None
        assert all(parents[node] == (path[i - 1] if i else -1) for i, node in enumerate(path)), (path, parents)
        del self.cached[base:]
        self.cached += [tokens[node] for node in path]

    def rewind(self, n_past: int) -> None:
        assert 0 <= n_past <= len(self.cached)
        self.pending_tree = None
        del self.cached[n_past:]

    def is_eog(self, token: int) -> bool:
        return token in self.eog


def one_hot_logits(choice: Callable[[list[int]], int], n_vocab: int) -> Callable[[list[int]], np.ndarray]:
    """Logits that make `choice(context)` the greedy pick, by a clear margin."""

    def next_logits(context: list[int]) -> np.ndarray:
        logits = np.zeros(n_vocab)
        logits[choice(context)] = 5.0
        return logits

    return next_logits
