"""Drafters: who proposes the tokens the verifier checks.

- `ModelDrafter`: a small draft model, with llama.cpp's early stop (`--draft-p-min`:
  stop proposing when the draft's top probability falls below p_min, after at
  least `n_min` tokens).
- `NgramDrafter`: prompt lookup. Proposes what followed the most recent earlier
  occurrence of the longest suffix n-gram of the context; no model at all.
- `HybridDrafter`: the n-gram proposal when the match is long, the model otherwise.

A deterministic proposal is a draft distribution with all its mass on one token
(a one-hot row), so the acceptance rule stays lossless under sampling: the token
is kept with probability target(x), and a rejection resamples from the target
with x removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, get_args

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .ngram_cache import SessionNgrams
from .sampling import SamplingSettings, sample_token, sparse_distribution

if TYPE_CHECKING:
    from .engine import Model

Source = Literal["model", "ngram"]  # who proposed a step's drafts: a draft model or prompt lookup
KeepDrafting = Callable[[list[float]], bool]  # asked after each draft token: go on?
# Asked after each draft token (the confidences so far, the runner-up's probability): add a sibling?
Branch = Callable[[list[float], float], bool]


@dataclass
class Drafts:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)  # one row per token when sampling; empty when greedy
    source: Source = "model"  # which drafter proposed them
    confidence: list[float] = field(default_factory=list)  # a draft model's top probability per token
    catchup_seconds: float = 0.0  # spent reading tokens the verifier decoded alone (plain steps)
    # A tree: node i's parent (-1: the verifier's pending token). Empty: a chain, node i after node i - 1.
    parents: list[int] = field(default_factory=list)
    # Siblings added beside the chain (leaves): node -> the runner-up probability that chose them.
    sides: dict[int, float] = field(default_factory=dict)

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


class Drafter(Protocol):
    source: Source

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        """Ingest the prompt (all but its last token) before the first step."""

    def room(self, context_length: int) -> int:
        """How many tokens it can still propose after a context of this length."""

    def next_source(self, context: list[int]) -> Source:
        """Who would propose after `context`: "model" (a draft model) or "ngram"."""

    def propose(
        self,
        context: list[int],
        k: int,
        *,
        n_vocab: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        branch: Branch | None = None,
    ) -> Drafts:
        """Up to k tokens that continue `context`. A drafter that knows its confidence asks
        `keep_drafting(confidences so far)` after each token and stops when it says no, and
        `branch(confidences so far, runner-up probability)` whether to add a sibling there."""

    def sync(self, context: list[int]) -> None:
        """The verifier settled on `context`: drop anything beyond it."""


def _align(logits: np.ndarray, n_vocab: int) -> np.ndarray:
    """Fit draft logits to the verifier's vocabulary: extra draft entries are cut,
    missing ones get -inf (the draft never proposes a token the verifier lacks)."""
    if logits.shape[-1] >= n_vocab:
        return logits[..., :n_vocab]
    pad = np.full(logits.shape[:-1] + (n_vocab - logits.shape[-1],), -np.inf, dtype=logits.dtype)
    return np.concatenate([logits, pad], axis=-1)


def common_prefix(cached: Sequence[int], tokens: Sequence[int]) -> int:
    n = 0
    for ours, theirs in zip(cached, tokens):
        if ours != theirs:
            break
        n += 1
    return n


def ingest(model: Model, prompt_tokens: Sequence[int]) -> None:
    """Bring a model's cache to prompt[:-1], keeping whatever prefix it already holds."""
    n_reused = common_prefix(model.cached, prompt_tokens[:-1])
    model.rewind(n_reused)
    model.eval(prompt_tokens[n_reused:-1], n_logits=0)


class NoDrafter:
    """Plain decoding: proposes nothing, so every step is one verifier token."""

    source: Source = "model"

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        pass

    def room(self, context_length: int) -> int:
        return 0

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def propose(
        self,
        context: list[int],
        k: int,
        *,
        n_vocab: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        branch: Branch | None = None,
    ) -> Drafts:
        return Drafts()

    def sync(self, context: list[int]) -> None:
        pass


class ModelDrafter:
    source: Source = "model"

    def __init__(self, model: Model, *, p_min: float = 0.0, n_min: int = 0):
        self.model = model
        self.p_min = p_min
        self.n_min = n_min
        self._agreed = 0  # the cache matched the context this far at the last sync

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        ingest(self.model, prompt_tokens)
        self._agreed = self.model.n_past

    def room(self, context_length: int) -> int:
        # It evaluates its pending tokens plus every draft but the last.
        return self.model.n_ctx - context_length + 1

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def propose(
        self,
        context: list[int],
        k: int,
        *,
        n_vocab: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        branch: Branch | None = None,
    ) -> Drafts:
        drafts = Drafts(source=self.source)
        feed = context[self.model.n_past :]
        if len(feed) > 2:  # after plain steps (or another drafter's): not a cost of drafting itself
            start = time.perf_counter()
            self.model.eval(feed[:-1], n_logits=0)
            drafts.catchup_seconds = time.perf_counter() - start
            feed = feed[-1:]
        parent = -1  # the chain's last node (-1: the verifier's pending token)
        for _ in range(k):
            logits = _align(self.model.eval(feed, n_logits=1), n_vocab)[0]
            if settings.greedy:
                token = int(np.argmax(logits))
                total = np.exp(logits - logits[token]).sum()
                top_prob, draft_probs = float(1.0 / total), None
                if branch is not None:  # a scan of the vocabulary, only when trees may use it
                    top_two = np.argpartition(logits, -2)[-2:]
                    runner = int(top_two[0] if top_two[0] != token else top_two[1])
                    runner_up = float(np.exp(logits[runner] - logits[token]) / total)
            else:
                support, weights = sparse_distribution(logits, settings)
                token = int(support[sample_token(weights, rng)])
                top_prob = float(weights.max())
                runner_up = float(np.partition(weights, -2)[-2]) if len(weights) > 1 else 0.0
                draft_probs = np.zeros(n_vocab)
                draft_probs[support] = weights
            # Early stop: an unsure draft is not worth a verifier slot.
            if len(drafts.confidence) >= self.n_min and top_prob < self.p_min:
                break
            node = drafts.add(token, parent, draft_probs)
            drafts.confidence.append(top_prob)
            if branch is not None and runner_up > 0.0 and branch(drafts.confidence, runner_up):
                # A sibling from the same distribution: greedy, the runner-up; sampling, a second
                # independent draw (a repeat of the first stays in the tree: the rule needs it).
                sibling = runner if settings.greedy else int(support[sample_token(weights, rng)])
                drafts.sides[drafts.add(sibling, parent, draft_probs)] = runner_up
            if self.model.is_eog(token) or (keep_drafting is not None and not keep_drafting(drafts.confidence)):
                break
            feed, parent = [token], node
        if not drafts.sides:
            drafts.parents = []  # a chain
        return drafts

    def sync(self, context: list[int]) -> None:
        # Keep what the cache shares with the context (a sibling the verifier took replaces the
        # chain's token there), never the newest token: it rides in with the next proposal.
        # The cache agreed with the context up to the last sync; only what came since is compared.
        agreed = min(self._agreed, self.model.n_past)
        agreed += common_prefix(self.model.cached[agreed:], context[agreed:])
        self._agreed = min(agreed, len(context) - 1)
        self.model.rewind(self._agreed)


class NgramDrafter:
    """Prompt lookup: continue the longest recent n-gram match in prompt + output; with a
    `session` cache (ngram_cache.py), what followed n-grams anywhere in the session where the
    context has no match. It teaches the session everything it reads and sees generated."""

    source: Source = "ngram"

    def __init__(
        self, *, max_ngram: int = 4, min_ngram: int = 2, window: int = 4096, session: SessionNgrams | None = None
    ):
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window
        self.session = session
        self._history: Sequence[int] = []  # the last answer's context (the engine's list), ...
        self._n_learned = 0  # ... learned this far

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        if self.session is not None:
            # A chat's next prompt repeats the conversation so far: only what is new is counted.
            self.session.learn(prompt_tokens, start=common_prefix(self._history[: self._n_learned], prompt_tokens))
            self._history, self._n_learned = prompt_tokens, len(prompt_tokens)

    def learn(self, context: list[int]) -> None:
        """Teach the session the tokens the verifier settled on since the last call."""
        if self.session is not None and len(context) > self._n_learned:
            self.session.learn(context, start=self._n_learned)
            self._history, self._n_learned = context, len(context)

    def room(self, context_length: int) -> int:
        return 1 << 30

    def next_source(self, context: list[int]) -> Source:
        return self.source

    def lookup(self, context: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest suffix n-gram's latest earlier occurrence,
        and that n-gram's length (0: no match)."""
        history = np.asarray(context[-self.window :], dtype=np.int64)
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            pattern = history[-n:]
            # Windows that start early enough to have at least one token after them.
            windows = sliding_window_view(history[:-1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            hits = hits[hits + n < len(history)]
            if hits.size:
                start = int(hits[-1]) + n  # the most recent occurrence
                return history[start : start + k].tolist(), n
        return self.session.lookup(context, k) if self.session is not None else ([], 0)

    def propose(
        self,
        context: list[int],
        k: int,
        *,
        n_vocab: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        branch: Branch | None = None,
    ) -> Drafts:
        return self.drafts(self.lookup(context, k)[0] if k > 0 else [], n_vocab=n_vocab, settings=settings)

    def drafts(self, tokens: list[int], *, n_vocab: int, settings: SamplingSettings) -> Drafts:
        """Deterministic proposals: when sampling, each a one-hot draft distribution."""
        probs = []
        if not settings.greedy:
            for token in tokens:
                one_hot = np.zeros(n_vocab)
                one_hot[token] = 1.0
                probs.append(one_hot)
        return Drafts(tokens=tokens, probs=probs, source=self.source)

    def sync(self, context: list[int]) -> None:
        self.learn(context)


class HybridDrafter:
    """The n-gram proposal when its match is at least `min_match` tokens long, else the model.
    Each step's `Drafts.source` says which; `kpolicy.PerSource` keeps a K policy for each."""

    source: Source = "model"

    def __init__(self, model_drafter: ModelDrafter, ngram: NgramDrafter, *, min_match: int = 3):
        self.model_drafter, self.ngram, self.min_match = model_drafter, ngram, min_match

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self.model_drafter.prepare(prompt_tokens)
        self.ngram.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.model_drafter.room(context_length)

    def next_source(self, context: list[int]) -> Source:
        found, match = self.ngram.lookup(context, 1)
        return self.ngram.source if found and match >= self.min_match else self.model_drafter.source

    def propose(
        self,
        context: list[int],
        k: int,
        *,
        n_vocab: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        branch: Branch | None = None,
    ) -> Drafts:
        # The same test as `next_source`, on the lookup the proposal needs anyway.
        found, match = self.ngram.lookup(context, k)
        if found and match >= self.min_match:
            return self.ngram.drafts(found, n_vocab=n_vocab, settings=settings)
        return self.model_drafter.propose(
            context, k, n_vocab=n_vocab, settings=settings, rng=rng, keep_drafting=keep_drafting, branch=branch
        )

    def sync(self, context: list[int]) -> None:
        self.model_drafter.sync(context)
        self.ngram.sync(context)


DrafterKind = Literal["model", "ngram", "hybrid"]  # as the command line names them
DRAFTERS: tuple[DrafterKind, ...] = get_args(DrafterKind)


def build_drafter(
    kind: DrafterKind,
    draft_model: Model | None,
    *,
    p_min: float = 0.0,
    n_min: int = 0,
    session: SessionNgrams | None = None,
) -> Drafter | None:
    """`kind` as the CLI names it; None when there is nothing to draft with. The n-gram and
    hybrid drafters also draft from, and teach, the `session` n-gram cache."""
    if kind == "ngram":
        return NgramDrafter(session=session)
    if draft_model is None:
        return None
    model_drafter = ModelDrafter(draft_model, p_min=p_min, n_min=n_min)
    return HybridDrafter(model_drafter, NgramDrafter(session=session)) if kind == "hybrid" else model_drafter
