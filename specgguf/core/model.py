"""What the algorithm needs from a model: the `Model` protocol (`llama.model.LlamaModel` is the real one).

Kept apart from the engine and the drafters, which both use it, so that neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Model(Protocol):
    """What the loop needs from a model. `llama.model.LlamaModel` is the real one."""

    n_vocab: int
    n_ctx: int
    max_leaves: int  # the most leaves a tree given to `eval_tree` may have (a chain has one)
    cached: list[int]  # the tokens in the KV cache, in order

    @property
    def n_past(self) -> int:
        """len(cached)."""

    def eval(self, tokens: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Append tokens to the cache; return logits rows (n_logits, n_vocab) for the last n_logits."""

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int], *, n_logits: int) -> np.ndarray:
        """Evaluate a tree after the cache: token i follows its ancestors (parents[i] < i; -1: the
        cache's end). Logits rows for the last n_logits tokens, each scoring what follows its path.
        The tree stays pending until `keep_path`."""

    def keep_path(self, path: Sequence[int]) -> None:
        """Append the pending tree's root-to-node `path` (indices into its tokens) to the cache, drop the rest.
        A backend may keep only a prefix of the path, the part it can keep exactly (`cached` says how
        much): the caller feeds the rest with its next batch, as it feeds the context's newest token."""

    def rewind(self, n_past: int) -> None:
        """Keep only the first n_past tokens in the cache."""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
