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
        self,
        next_logits: Callable[[list[int]], np.ndarray],
        *,
        n_vocab: int,
        n_ctx: int = 256,
        eog: Sequence[int] = (),
        max_leaves: int = 16,  # as LlamaModel's (llama/tree.py MAX_TREE_LEAVES)
    ):
        self.next_logits = next_logits
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.max_leaves = max_leaves
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
        n_leaves = len(set(range(len(tokens))) - set(parents))
        if n_leaves > self.max_leaves:  # refused as LlamaModel refuses it
            raise ValueError(f"a tree with {n_leaves} leaves; at most {self.max_leaves}")
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

    def save_state(self) -> tuple[bytes, list[int]]:
        """As LlamaModel's (the server's cache slots): the "cache" as bytes, and its tokens."""
        return np.asarray(self.cached, dtype=np.int64).tobytes(), list(self.cached)

    def load_state(self, state: bytes, tokens: list[int]) -> None:
        """Restore `save_state`'s; refuses a token list that is not the one the state holds."""
        assert np.frombuffer(state, dtype=np.int64).tolist() == list(tokens), "state and tokens disagree"
        self.pending_tree = None
        self.cached = list(tokens)


def one_hot_logits(choice: Callable[[list[int]], int], n_vocab: int) -> Callable[[list[int]], np.ndarray]:
    """Logits that make `choice(context)` the greedy pick, by a clear margin."""

    def next_logits(context: list[int]) -> np.ndarray:
        logits = np.zeros(n_vocab)
        logits[choice(context)] = 5.0
        return logits

    return next_logits


class TableConstraint:
    """A grammar as a small automaton (implements core.constraint.Constraint): `allowed[state]` is the
    set of tokens allowed there, `step(state, token)` the next state."""

    def __init__(self, allowed: dict[int, set[int]], step: Callable[[int, int], int], *, n_vocab: int, start: int = 0):
        self.table, self.step, self.n_vocab = allowed, step, n_vocab
        self.states = [start]  # the state after each token advanced (the first: the start)
        self.mask_calls = 0

    @property
    def state(self) -> int:
        return self.states[-1]

    def allowed(self) -> np.ndarray:
        self.mask_calls += 1
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[sorted(self.table[self.state])] = True
        return mask

    def advance(self, token: int) -> None:
        assert token in self.table[self.state], f"token {token} is not allowed in state {self.state}"
        self.states.append(self.step(self.state, token))

    def rollback(self, n_tokens: int) -> None:
        assert 0 <= n_tokens < len(self.states)
        del self.states[len(self.states) - n_tokens :]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        state = self.state
        for n, token in enumerate(tokens):
            if token not in self.table[state]:
                return n
            state = self.step(state, token)
        return len(tokens)

    def forced(self) -> list[int]:
        state, tokens = self.state, list[int]()
        while len(self.table[state]) == 1 and len(tokens) < 8:
            (token,) = self.table[state]
            tokens.append(token)
            state = self.step(state, token)
        return tokens


class TextVocab:
    """A vocabulary of byte pieces with a longest-match tokenizer (the draft's, in cross-vocabulary
    tests): deterministic, and its boundaries move as text grows (`a` then `b` reads as `ab`)."""

    def __init__(self, pieces: Sequence[bytes]):
        self.pieces = list(pieces)
        self.longest = max(len(piece) for piece in pieces)
        self._ids: dict[bytes, int] = {}  # piece -> its first id (as `pieces.index`), looked up without a scan
        for token, piece in enumerate(self.pieces):
            self._ids.setdefault(piece, token)

    def tokenize(self, text: bytes) -> list[int]:
        tokens, at = [], 0
        while at < len(text):
            for size in range(min(self.longest, len(text) - at), 0, -1):
                token = self._ids.get(text[at : at + size])
                if token is not None:
                    tokens.append(token)
                    at += size
                    break
            else:
                raise AssertionError(f"no piece for {text[at:]!r}")
        return tokens

    def text(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.pieces[token] for token in tokens)
