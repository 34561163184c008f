"""Drafting: what every drafter shares. The drafters themselves are one per module
(`model_drafter`, `ngram_drafter`, `hybrid_drafter`, `cross_drafter`); `drafters` is the table of kinds.

A deterministic proposal is a draft distribution with all its mass on one token
(a one-hot row), so the acceptance rule stays lossless under sampling: the token
is kept with probability target(x), and a rejection resamples from the target
with x removed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from .model import Model
from .sampling import SamplingSettings

if TYPE_CHECKING:
    from .constraint import Constraint

# Who proposed a step's drafts: a draft model, prompt lookup, or a grammar's forced tokens (free,
# and under the grammar's mask nearly always right: forced_drafter.py).
Source = Literal["model", "ngram", "grammar"]
# Sources that propose a whole draft at once, each token with its prior chance, at no cost per drafted
# token (prompt lookup): the policy lets `worth` cut each proposal rather than choosing K ahead.
WHOLE_DRAFTS: frozenset[Source] = frozenset({"ngram"})
KeepDrafting = Callable[[list[float]], bool]  # asked after each draft token: go on?
# Asked after each draft token (the confidences so far, the runner-up's probability): add a sibling?
Branch = Callable[[list[float], float], bool]


@dataclass
class Drafts:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)  # one row per token when sampling; empty when greedy
    source: Source = "model"  # which drafter proposed them
    confidence: list[float] = field(default_factory=list)  # a draft model's top probability per token
    catchup_seconds: float = 0.0  # spent reading what it had not seen: the prompt, plain steps, n-gram steps
    text_seconds: float = 0.0  # a draft of another vocabulary's text round trip (decode, re-encode)
    # A tree: node i's parent (-1: the verifier's pending token). Empty: a chain, node i after node i - 1.
    parents: list[int] = field(default_factory=list)
    # Siblings added beside the chain (leaves): node -> the runner-up probability that chose them.
    sides: dict[int, float] = field(default_factory=dict)
    # Under a grammar: the masks the drafter applied, mask i before draft i (grammar_walk.GrammarWalk reuses
    # them); None before a forced token (`add_forced`), left to the walk.
    masks: list[np.ndarray | None] = field(default_factory=list)

    def cut(self, n: int) -> Drafts:
        """The chain's first n drafts (a grammar forbids the next one)."""
        if n >= len(self.tokens):
            return self
        self.tokens, self.probs, self.confidence = self.tokens[:n], self.probs[:n], self.confidence[:n]
        self.masks = self.masks[: n + 1]
        return self

    def tree(self) -> list[int]:
        """Every node's parent, a chain included."""
        return self.parents or list(range(-1, len(self.tokens) - 1))

    def add(self, token: int, parent: int, probs: np.ndarray | None) -> int:
        """Append a node below `parent` (-1: the pending token); returns its index."""
        if not self.parents:
            self.parents = self.tree()
        self.tokens.append(token)
        self.parents.append(parent)
        if probs is not None:
            self.probs.append(probs)
        return len(self.tokens) - 1


@dataclass(frozen=True)
class DraftStep:
    """What a drafter is given for one step besides the context and K: the verifier's vocabulary
    size, the sampling settings and random generator, and the K policy's two questions."""

    n_vocab: int
    settings: SamplingSettings
    rng: np.random.Generator
    keep_drafting: KeepDrafting | None = None
    # For a proposal known whole, with each draft's chance from its evidence: how many to verify.
    worth: Callable[[list[float]], int] | None = None
    branch: Branch | None = None
    # A grammar (constraint.Constraint): a drafter masks its distribution by it at each draft and
    # leaves it as it found it.
    constraint: Constraint | None = None


class Drafter(Protocol):
    source: Source

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        """Before the first step: take the prompt in (all but its last token), or note that a
        draft model is to catch up on it when it first drafts (model_drafter.py)."""

    def room(self, context_length: int) -> int:
        """How many tokens it can still propose after a context of this length."""

    def next_source(self, context: list[int]) -> Source:
        """Who would propose after `context`: "model" (a draft model) or "ngram"."""

    def unread(self, context: list[int]) -> int:
        """How many tokens of `context` a draft model must read before it can propose (its catch-up:
        core/reading.py decides when that pays); 0 for a drafter that reads nothing first."""

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        """Up to k tokens that continue `context`. A drafter that knows its confidence asks
        `step.keep_drafting(confidences so far)` after each token and stops when it says no, and
        `step.branch(confidences so far, runner-up probability)` whether to add a sibling there."""

    def sync(self, context: list[int]) -> None:
        """The verifier settled on `context`: drop anything beyond it."""


def common_prefix(cached: Sequence[int], tokens: Sequence[int]) -> int:
    n = 0
    for ours, theirs in zip(cached, tokens):
        if ours != theirs:
            break
        n += 1
    return n


def reusable(cached: Sequence[int], prompt_tokens: Sequence[int]) -> int:
    """How much of a model's cache a prompt can keep: their common prefix, but never the prompt's newest
    token, which is always read again so that its pass scores what follows the prompt."""
    return common_prefix(cached, prompt_tokens[:-1])


def fixed_drafts(tokens: list[int], step: DraftStep, source: Source) -> Drafts:
    """Deterministic proposals (n-gram lookups, a grammar's forced tokens): when sampling, each
    token's draft distribution is one-hot, q = 1 on it, as the acceptance rule needs."""
    probs = [] if step.settings.greedy else [_one_hot(token, step.n_vocab) for token in tokens]
    return Drafts(tokens=tokens, probs=probs, source=source)


def add_forced(drafts: Drafts, step: DraftStep, *, room: int) -> list[int]:
    """Inside a chain under a grammar (`step.constraint`, advanced along the chain): append what it
    forces next, at most `room` tokens, advancing it. Each is a deterministic function of the chain
    before it, so its q is one-hot and the rule checks it as any draft (kept with p(x)); confidence 1."""
    assert step.constraint is not None and not drafts.sides, "a chain under a grammar"
    forced = step.constraint.forced()[: max(0, room)]
    drafts.masks += [None] * (len(drafts.tokens) - len(drafts.masks))  # mask i stays before draft i
    for token in forced:
        drafts.add(token, len(drafts.tokens) - 1, None if step.settings.greedy else _one_hot(token, step.n_vocab))
        drafts.confidence.append(1.0)
        drafts.masks.append(None)
        step.constraint.advance(token)
    return forced


def _one_hot(token: int, n_vocab: int) -> np.ndarray:
    row = np.zeros(n_vocab)
    row[token] = 1.0
    return row


def ingest(model: Model, prompt_tokens: Sequence[int]) -> tuple[int, np.ndarray]:
    """Bring a model's cache to the whole prompt, keeping whatever prefix it already holds (but its newest
    token, always read); (the tokens read, the logits row of the newest: what follows the prompt)."""
    n_reused = reusable(model.cached, prompt_tokens)
    model.rewind(n_reused)
    return len(prompt_tokens) - n_reused, model.eval(prompt_tokens[n_reused:], n_logits=1)


class NoDrafter:
    """Plain decoding: proposes nothing, so every step is one verifier token."""

    source: Source = "model"

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        pass

    def unread(self, context: list[int]) -> int:
        return 0

    def room(self, context_length: int) -> int:
        return 0

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        return Drafts()

    def sync(self, context: list[int]) -> None:
        pass


def capped(branch: Branch, max_siblings: int) -> Branch:
    """`branch`, saying no after `max_siblings` yeses: each adds a sibling, a leaf beside the chain's
    own, and the verifier takes trees of at most `max_leaves` leaves."""
    n_siblings = 0

    def capped(confidences: list[float], runner_up: float) -> bool:
        nonlocal n_siblings
        taken = n_siblings < max_siblings and branch(confidences, runner_up)
        n_siblings += taken
        return taken

    return capped
