"""A draft tree laid out in llama.cpp's KV cache: which batch slot and which sequences each node gets,
and how much of a chosen path can stay in the cache exactly.

Each leaf's path is one llama.cpp sequence (all in one unified cache): a node belongs to the
sequences of the leaves below it, so it attends to the context and its own ancestors only.

Why the batch order matters. The cache's cells, not the tokens' positions, set the order in which
attention visits the keys: llama.cpp's CPU flash attention (on by default) runs its online softmax
over the cells in index order and accumulates the values in F16 (`VKQ16` in ggml-cpu's ops.cpp), so
the same keys in another cell order round differently. A batch takes the free cells after the
context in batch order. Keeping a path that skips a dropped node leaves a hole; llama.cpp puts the
next token in the first free cell, the hole, before a kept key that is older than it, and on
SmolLM2-135M the next logits then move by up to 0.5, where a linear evaluation of the same context,
or the same path kept without a hole, matches bit for bit. So a kept path must be the first nodes
of the batch. The batch is in depth-first order, children in the caller's order (the draft chain
first, each sibling after the rest of the chain), which makes every chain prefix such a path; of a
path that ends on a sibling, the part before the sibling stays and the caller feeds the sibling
again with its next batch: one more token there, not a pass of its own (docs/adaptive-k.md has
what the alternatives cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_TREE_LEAVES = 16  # sequences per context: the most leaves a draft tree may have


@dataclass
class TreeLayout:
    """A tree evaluated after `base` cached tokens: its batch order and each node's sequences."""

    base: int
    tokens: list[int]
    parents: list[int]
    order: list[int]  # the node in each batch slot: depth first, children in index order
    sequences: list[list[int]]  # each node's sequences (its leaves below, in batch order)
    n_sequences: int  # one per leaf

    @classmethod
    def plan(cls, base: int, tokens: Sequence[int], parents: Sequence[int]) -> TreeLayout:
        children: list[list[int]] = [[] for _ in tokens]
        roots: list[int] = []
        for node, parent in enumerate(parents):
            if not -1 <= parent < node:
                raise ValueError(f"node {node}'s parent {parent} does not come before it")
            (children[parent] if parent >= 0 else roots).append(node)
        order: list[int] = []
        stack = roots[::-1]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(children[node][::-1])
        leaves = [node for node in order if not children[node]]
        if len(leaves) > MAX_TREE_LEAVES:
            raise ValueError(f"a tree with {len(leaves)} leaves; at most {MAX_TREE_LEAVES}")
        sequences: list[list[int]] = [[] for _ in tokens]
        for sequence, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                sequences[node].append(sequence)
                node = parents[node]
        return cls(base, list(tokens), list(parents), order, sequences, len(leaves))

    @property
    def chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def fill(self, batch: Any, n_logits: int) -> list[int]:
        """Write the tree into a llama_batch, logits for the last n_logits nodes; returns those nodes
        in batch order (the order llama.cpp gives their rows back)."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(depth[parent] + 1 if parent >= 0 else 0)
        first_output = len(self.tokens) - n_logits
        for slot, node in enumerate(self.order):
            batch.token[slot] = self.tokens[node]
            batch.pos[slot] = self.base + depth[node]
            batch.n_seq_id[slot] = len(self.sequences[node])
            for j, sequence in enumerate(self.sequences[node]):
                batch.seq_id[slot][j] = sequence
            batch.logits[slot] = node >= first_output
        batch.n_tokens = len(self.tokens)
        return [node for node in self.order if node >= first_output]

    def exact_prefix(self, path: Sequence[int]) -> int:
        """How much of `path` can stay cached exactly: its nodes in the first batch slots, no hole before them."""
        n = 0
        while n < len(path) and self.order[n] == path[n]:
            n += 1
        return n
