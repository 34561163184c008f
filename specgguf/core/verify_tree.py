"""The verifier's batch for one step: the pending token(s), then the draft tree's distinct nodes."""

from __future__ import annotations

from dataclasses import dataclass

from .drafting import Drafts


@dataclass
class VerifyTree:
    """The verifier's batch: the pending token(s) as a chain, then the draft tree's distinct nodes
    (a sampled sibling may repeat its parent's other draw: it is checked once)."""

    tokens: list[int]
    parents: list[int]
    root: int  # index of the newest pending token, whose row scores what follows the context
    rows: list[int]  # draft node -> its index in `tokens`

    @classmethod
    def build(cls, pending: list[int], drafts: Drafts) -> VerifyTree:
        tokens, parents, root = list(pending), list(range(-1, len(pending) - 1)), len(pending) - 1
        index: dict[tuple[int, int], int] = {}
        rows: list[int] = []
        for token, parent in zip(drafts.tokens, drafts.tree()):
            key = (root if parent < 0 else rows[parent], token)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
            rows.append(index[key])
        return cls(tokens, parents, root, rows)

    @property
    def n_checked(self) -> int:
        """Distinct draft tokens in the batch."""
        return len(self.tokens) - self.root - 1

    @property
    def n_rows(self) -> int:
        """Logits rows needed: the newest pending token's and every node's."""
        return len(self.tokens) - self.root

    def row(self, node: int) -> int:
        """The logits row scoring what follows draft node `node` (-1: the context)."""
        return (self.root if node < 0 else self.rows[node]) - self.root

    def kept(self, path: list[int]) -> list[int]:
        """The batch indices to keep: the pending tokens, then the accepted path."""
        return list(range(self.root + 1)) + [self.rows[node] for node in path]
