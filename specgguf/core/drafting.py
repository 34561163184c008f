"""Drafting: what every drafter shares, and when a draft model reads a long context (`Reading`). The
drafters themselves are one per module (`model_drafter`, `ngram_drafter`, `cross_drafter`,
`string_drafter`); `drafters` is the table of kinds, with the hybrid that picks between two of them.

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
# Sources whose drafters report each draft's confidence and ask `keep_drafting` after it (a draft model's:
# model_drafter, cross_drafter, string_drafter): the policy lets that end the draft from the first step.
CONFIDENT: frozenset[Source] = frozenset({"model"})
KeepDrafting = Callable[[list[float]], bool]  # asked after each draft token: go on?
# What may follow a context, at most k tokens, with each one's chance given those before it were right
# (prompt lookup's evidence): a draft model reads them ahead (model_drafter).
Guess = Callable[[list[int], int], tuple[list[int], list[float]]]
# Asked after each draft token (the confidences so far, the runner-up's probability): add a sibling?
Branch = Callable[[list[float], float], bool]


@dataclass
class Drafts:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)  # one row per token when sampling; empty when greedy
    source: Source = "model"  # which drafter proposed them
    confidence: list[float] = field(default_factory=list)  # a draft model's top probability per token
    catchup_seconds: float = 0.0  # spent reading what it had not seen: the prompt, plain steps, n-gram steps
    catchup_tokens: int = 0  # ... and how many tokens that was
    read_ahead: int = 0  # drafts whose row a draft model read ahead with a guess: no pass of their own
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
    # A token the answer would end with (an editor's completion past its time budget ends at a line's
    # end: serve's line_end): a drafter that drafts token by token stops after it, nothing past it is kept.
    last: Callable[[int], bool] | None = None


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
        `Reading` below decides when that pays); 0 for a drafter that reads nothing first."""

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


class Wrapper:
    """A drafter around `inner` that changes some of what it does (forced_drafter.ForcedDrafter, serve's
    line_end.LineEndDrafter): every call it does not override is `inner`'s. A subclass sets `source`."""

    source: Source

    def __init__(self, inner: Drafter):
        self.inner = inner

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self.inner.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.inner.room(context_length)

    def next_source(self, context: list[int]) -> Source:
        return self.inner.next_source(context)

    def unread(self, context: list[int]) -> int:
        return self.inner.unread(context)

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        return self.inner.propose(context, k, step)

    def sync(self, context: list[int]) -> None:
        self.inner.sync(context)


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


LONG_READ = 64  # unread tokens; fewer are read at once
DRAFT_READ_PRIOR = 0.5  # of the verifier's seconds a token (measured 0.57 for the 0.5B draft of the 1.5B)


@dataclass
class Reading:
    """When a draft model starts reading: its catch-up on a long unread context (a new prompt, a long
    tool result) is paid before its first draft, and on a compute-bound CPU it can cost more than its
    drafts win back on a short answer. Measured on the default pair (scripts/first_token.py): after a
    649-token agent prompt the 0.5B draft reads for 8 s, and the 48-token answer that plain decoding
    writes in 3 s took 12 s.

    The rule is ski rental's. Reading is the purchase, R seconds; not having read is the rent: while the
    draft's steps are plain (prompt lookup and a grammar's forced tokens, which read nothing first, still
    draft), each second of the answer loses what drafting would have saved of it, 1 − 1/s for drafting
    at s times plain decoding's rate (the K policy's estimate, `KPolicy.speedup`: until the draft's
    drafts have shown what they do, at no less than its acceptance measured for the pair here). The
    draft reads on the step whose rent would bring what was paid up to the price, (waited + that step)
    · (1 − 1/s) ≥ R, the step priced as the last one took: ski rental on whole days buys on the day the
    rent would reach the price, not the day after. An answer too short to pay the reading back
    never reads, and a long one loses at most the reading's time to waiting, whatever s turns out to be;
    where s ≤ 1 (drafting from the model cannot win here) it never reads. With s unknown (a fixed K)
    the rent is the whole of each second, as if drafting were free and sure. Measured on the F16
    verifier: a chat's fifth turn (1,154 tokens the draft never read) read for 4.6 s after 120 of its 147
    tokens, drafting at about 1.3× where it paid nothing back: 0.68× plain; with the rent the draft never
    reads there. Less than `LONG_READ` unread tokens (a chat's new turn) is read at once, as before.
    Those two (the step counted, the measured acceptance) on the F16 verifier (docs/benchmarks.md, "The
    reading's rent"): a cold tool call 1.14× (8 steps against 11), other cold answers within ±5%, the
    agent, chat and editor traces 0.97×, 0.99× and 1.02×.

    The reading's cost per token starts as the draft's own reading timed once on this machine (tuning.probe,
    kept in tuning.json), or where that is not known `DRAFT_READ_PRIOR` of the verifier's own reading of
    this prompt (the draft is the smaller model; of what the verifier read, when its cache held the rest),
    and is then what the draft's catch-ups measured."""

    per_token: float  # seconds the draft model takes to read a token (estimated, then measured)
    waited: float = 0.0  # seconds this answer's steps have taken so far
    last_step: float = 0.0  # ... the newest of them: what the step about to run is expected to take

    @classmethod
    def after_prefill(cls, seconds: float, n_read: int, *, measured: float | None = None) -> Reading:
        """The prior from the verifier's reading of the prompt, however short. A short read costs more a
        token than a long one, so the prior errs towards waiting, and it matters only where the draft has
        more than `LONG_READ` tokens unread: a prompt whose start the verifier's cache held (a server's
        tools and system prompt, read for an earlier request) and the draft model never read. With no
        prior there, the draft read a 300-token tools prompt before a 37-token answer: 0.42x plain.
        `measured`: the draft's own reading, timed on this machine (tuning.probe), where known: on the
        F16 verifier the prior says 7.9 ms a token where the 0.5B draft reads at 3.8."""
        if measured is not None:
            return cls(measured)
        return cls(DRAFT_READ_PRIOR * seconds / n_read if n_read else 0.0)

    def defers(self, unread: int, speedup: Callable[[], float | None] = lambda: None) -> bool:
        """A draft model's step waits: reading `unread` tokens costs more than not having read them will
        have cost once this step is plain too, the answer's seconds (so far, and this step's, priced as
        the last one took) times the share 1 − 1/s of them drafting would save, s = `speedup()` (asked
        only for a long read: most steps have none, and the policy's estimate is not free). Counting the
        step about to run is ski rental's rule on whole days: buy on the day whose rent would reach
        the price, not the day after."""
        if unread <= LONG_READ:
            return False
        s = speedup()
        rent = 1.0 if s is None else max(0.0, 1.0 - 1.0 / s)
        return unread * self.per_token > (self.waited + self.last_step) * rent

    def observe(self, step_seconds: float, catchup_seconds: float, n_read: int) -> None:
        """A step took `step_seconds`; the draft read `n_read` tokens in `catchup_seconds` of it."""
        self.waited += step_seconds
        self.last_step = step_seconds
        if catchup_seconds > 0 and n_read >= LONG_READ:
            self.per_token = catchup_seconds / n_read
