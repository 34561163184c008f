"""The draft/verify loop over a small model protocol.

`speculate` is the whole algorithm: draft K tokens with the small model, score
all of them with one batched verifier pass, keep the accepted prefix plus the
verifier's own next token, roll both KV caches back, repeat. It yields one
`StepEvent` per verify pass (events.py); rendering and statistics only read those events.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from functools import partial
from typing import Protocol

import numpy as np

from ..errors import ContextFullError, PromptError
from .block_verify import accept_block
from .constraint import Constraint
from .costs import MachineCosts
from .drafting import Drafter, Drafts, DraftStep, NoDrafter, Reading, Source, capped, ingest
from .events import StepEvent, StepSeconds, VerifyTree, step_event, stop_event
from .forced_drafter import ForcedDrafter
from .grammar_walk import GrammarWalk
from .model import Model
from .rounds import Round
from .sampling import (
    SamplingSettings,
    accept_tree,
    accept_tree_greedy,
    apply_penalties,
    mask_logits,
    process_logits,
    sample_token,
    sparse_distribution,
)


class KPolicy(Protocol):
    """Picks K before each step and learns from its event (see kpolicy.py)."""

    def choose(self, source: Source = "model") -> int:
        """K for the next step; `source` is the drafter about to propose ("model", "ngram" or "grammar")."""

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Asked after each draft token (its top probabilities so far): go on drafting?"""

    def worth(self, confidences: list[float]) -> int:
        """For a proposal known whole (prompt lookup), each draft with the chance its evidence gives it of
        being accepted after the ones before: how many of its first drafts to verify (0: a plain step)."""

    @property
    def branches(self) -> bool:
        """Whether `branch` can ever say yes (else the drafter need not find runner-ups)."""

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        """Asked after each draft token: add the runner-up (of this probability) as a sibling?"""

    def observe(self, event: StepEvent) -> None: ...
    @property
    def adapts(self) -> bool:
        """Whether K is chosen step by step from what the steps teach (False: a fixed K)."""

    def drafts(self, source: Source = "model") -> bool:
        """Whether steps draft from `source` now: not at a fixed K of 0, nor where they cannot win yet."""

    def expected(self, source: Source) -> np.ndarray | None:
        """E(k), k = 0..k_max, of `source`'s drafts as priced (None: a fixed K, or no such source)."""

    def speedup(self, source: Source) -> float | None:
        """The rate drafting from `source` is expected to make at its best K, as priced, in times plain
        decoding's (None: not known, as at a fixed K): what a draft model's reading would buy."""

    def read_seconds(self, source: Source) -> float | None:
        """Seconds a token `source` takes to read a long unread context, as measured on this machine
        (None: not known): what a draft model's reading costs (core/drafting.py)."""

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        """(the step's seconds, its draft model's catch-up seconds) as a long read's wait counts them
        (drafting.Reading): `elapsed` and the event's own, or (core/repeatable.py) what the machine's
        costs say, so that when a draft reads follows from the request's tokens alone."""

    def share(self, round: Round) -> None:
        """Price the steps as one of the round's requests stepping in the same passes (rounds.Round)."""

    def learned_costs(self) -> MachineCosts | None:
        """What the steps taught about this machine's costs, once enough ran alone (else None)."""


class FixedK:
    branches = adapts = False  # a fixed K is a chain, as llama.cpp's --draft-max, and learns nothing

    def __init__(self, k: int, *, read_seconds: float | None = None):
        # read_seconds: the draft model's reading a token, measured on this machine (tuning.read_cost),
        # what a long catch-up costs (drafting.Reading); None: priced from the prompt's own pass.
        self.k, self._read_seconds = k, read_seconds

    def choose(self, source: Source = "model") -> int:
        return self.k

    def drafts(self, source: Source = "model") -> bool:
        return self.k > 0

    def expected(self, source: Source) -> np.ndarray | None:
        return None

    def speedup(self, source: Source) -> float | None:
        return None

    def read_seconds(self, source: Source) -> float | None:
        return self._read_seconds if source == "model" else None

    def clock(self, event: StepEvent, elapsed: float) -> tuple[float, float]:
        return elapsed, event.draft_catchup_seconds

    def share(self, round: Round) -> None:
        pass

    def learned_costs(self) -> MachineCosts | None:
        return None

    def keep_drafting(self, confidences: list[float]) -> bool:
        return True

    def worth(self, confidences: list[float]) -> int:
        return len(confidences)  # a fixed K verifies what it drafted

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        return False

    def observe(self, event: StepEvent) -> None:
        pass


def speculate(
    *,
    verifier: Model,
    drafter: Drafter | None = None,
    prompt_tokens: Sequence[int],
    k: int | KPolicy,
    max_tokens: int,
    settings: SamplingSettings,
    rng: np.random.Generator,
    constraint: Constraint | None = None,
) -> Generator[StepEvent, None, None]:
    """Generate up to max_tokens with speculative decoding; k=0 (or no drafter) is plain decoding.

    `drafter` proposes the drafts (drafting.py: a draft model, prompt lookup, or both);
    `k` is a fixed number of drafts or a policy that picks one per step. `constraint`: a grammar
    the answer follows (constraint.py), its state at the answer's start; the output's law is then
    the masked verifier's, and the tokens it forces are free drafts (forced_drafter.py).
    """
    check_prompt(verifier, prompt_tokens, max_tokens)
    drafter = drafter or NoDrafter()
    if constraint is not None:
        drafter = ForcedDrafter(drafter, constraint)
    policy = FixedK(k) if isinstance(k, int) else k
    start = time.perf_counter()
    # The prompt's pass reads all of it (what a cache already holds, an earlier chat turn, is kept) and its
    # last row scores the answer's first token: the first step is plain, with no pass of its own, so the
    # first token goes out as soon as the prompt is read. (Drafting there would cost the same rows, the
    # drafts after the first token then riding with it in the next batch, and hold the first token back by
    # a pass.) From then on the verifier's cache holds all of the context but its newest token, which rides
    # in the next batch. A draft model catches up when it drafts (model_drafter.py), a long read once it
    # pays (drafting.py).
    ready: np.ndarray | None  # the row scoring what follows the context, while no pass has (the first step)
    n_read, ready = ingest(verifier, prompt_tokens)
    drafter.prepare(prompt_tokens)
    prefill_seconds = time.perf_counter() - start
    reading = Reading.after_prefill(prefill_seconds, n_read, measured=policy.read_seconds("model"))
    context, n_emitted = list(prompt_tokens), 0
    while len(context) <= verifier.n_ctx:
        # The verifier's batch (the pending token plus the drafts) must fit, and the answer's length.
        room = min(verifier.n_ctx - len(context), drafter.room(len(context)), max_tokens - n_emitted - 1)
        unread, k_step = 0, 0  # the first step is plain: the prompt's pass scored its token
        if ready is None:
            source = drafter.next_source(context)
            unread = drafter.unread(context) if source == "model" else 0
            k_step = (
                0
                if reading.defers(unread, partial(policy.speedup, source))
                else max(0, min(policy.choose(source), room))
            )
        t0 = time.perf_counter()
        drafts, walk = _propose(drafter, policy, context, k_step, verifier, settings, rng, constraint)
        t1 = time.perf_counter()
        # One batched pass over the pending token and the draft tree: row 0 scores what follows the
        # context (on the first step, the prompt pass's row), row 1 + i what follows draft node i's path.
        tree = VerifyTree.build(context[verifier.n_past :], drafts)
        target_logits = _score(verifier, tree, ready)
        t2 = time.perf_counter()
        path, next_token = _accept(tree, target_logits, drafts, settings, rng, context, walk)
        emitted = [drafts.tokens[node] for node in path] + [next_token]
        if walk is not None:  # the grammar's state moves on by what was accepted, up to an end token
            walk.commit(_through_end(emitted, verifier))
        context += emitted
        # Both caches keep the accepted path: all of the context but its newest token (the verifier
        # may keep less, what it can keep exactly: the rest rides in its next batch).
        if tree.tokens:  # (a step the prompt's pass scored alone has no tree)
            verifier.keep_path(tree.kept(path))
        drafter.sync(context)
        seconds = StepSeconds(draft=t1 - t0, verify=t2 - t1, sample=time.perf_counter() - t2, prefill=prefill_seconds)
        event = step_event(emitted, drafts, path, tree, target_logits, verifier, max_tokens - n_emitted, seconds)
        prefill_seconds, n_emitted = 0.0, n_emitted + len(event.tokens)
        reading.observe(*policy.clock(event, time.perf_counter() - t0), unread if k_step else 0)
        if ready is None:  # a step whose row came from the prompt's pass teaches nothing about passes
            policy.observe(event)
        ready = None
        yield event
        if event.stop:
            return
    yield stop_event("context", prefill_seconds)


def _propose(
    drafter: Drafter,
    policy: KPolicy,
    context: list[int],
    k: int,
    verifier: Model,
    settings: SamplingSettings,
    rng: np.random.Generator,
    constraint: Constraint | None = None,
) -> tuple[Drafts, GrammarWalk | None]:
    """The drafter's proposal of up to k tokens (none at k = 0), asking the policy as it goes; under
    a grammar, cut at its first forbidden token (a prompt-lookup draft), with the grammar's walk
    along it (the masks of every position)."""
    # Siblings add up to one node per draft: only where the cache has room for them (and a chain under a grammar).
    trees = policy.branches and 2 * k <= verifier.n_ctx - len(context) and constraint is None
    step = DraftStep(
        n_vocab=verifier.n_vocab,
        settings=settings,
        rng=rng,
        keep_drafting=policy.keep_drafting,
        worth=policy.worth,
        branch=capped(policy.branch, verifier.max_leaves - 1) if trees else None,
        constraint=constraint,
    )
    drafts = drafter.propose(context, k, step) if k else Drafts()
    if constraint is None:
        return drafts, None
    drafts = drafts.cut(constraint.valid_prefix(drafts.tokens))
    return drafts, GrammarWalk(constraint, drafts)


def _score(verifier: Model, tree: VerifyTree, ready: np.ndarray | None) -> np.ndarray:
    """The tree's logits rows, in one batched pass; on the first step, which drafts nothing, the row the
    prompt's pass made (`ready`: the cache holds the whole context), and no pass."""
    if ready is not None:
        assert not tree.tokens, "the first step drafts nothing"
        return ready
    return verifier.eval_tree(tree.tokens, tree.parents, n_logits=tree.n_rows)


def _through_end(emitted: list[int], verifier: Model) -> list[int]:
    """The emitted tokens up to and with the first end-of-generation token."""
    end = next((i + 1 for i, token in enumerate(emitted) if verifier.is_eog(token)), None)
    return emitted[:end]


def check_prompt(verifier: Model, prompt_tokens: Sequence[int], max_tokens: int) -> None:
    """The prompt can be answered: not empty, and room in the context (callers may ask before `speculate`)."""
    if not prompt_tokens:
        raise PromptError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if len(prompt_tokens) >= verifier.n_ctx:
        raise ContextFullError(
            f"the prompt is {len(prompt_tokens)} tokens but the context holds {verifier.n_ctx};"
            " raise -c/--ctx-size or shorten the prompt"
        )


def _accept(
    tree: VerifyTree,
    target_logits: np.ndarray,
    drafts: Drafts,
    settings: SamplingSettings,
    rng: np.random.Generator,
    context: list[int],
    walk: GrammarWalk | None = None,
) -> tuple[list[int], int]:
    """(accepted draft nodes, the verifier's next token): at temperature 0 the path of the
    verifier's argmax, else the speculative sampling rule over the tree (sampling.accept_tree), or
    on a chain block verification if the settings ask for it (block_verify.accept_block), on the
    processed distributions. Each row gets the processing the draft's row for that position got:
    penalties and logit bias (sampling.apply_penalties) with that row's own context (the step's
    context plus the node's path), then, under a grammar (`walk`), the mask of its state there."""
    parents = drafts.tree()
    rows: dict[int, np.ndarray] = {}  # each node's row and distribution, made when first asked for
    distributions: dict[int, np.ndarray] = {}  # (dicts: a functools.cache per step costs more)

    def row(node: int) -> np.ndarray:
        if node not in rows:
            logits = target_logits[tree.row(node)]
            if settings.penalties.active:
                logits = apply_penalties(logits, _path_context(context, drafts, parents, node), settings)
            rows[node] = logits if walk is None else mask_logits(logits, walk.mask(node))
        return rows[node]

    if settings.greedy:
        return accept_tree_greedy(
            target_argmax=lambda node: int(np.argmax(row(node))),
            draft_tokens=drafts.tokens,
            parents=parents,
        )

    def target_probs(node: int) -> np.ndarray:  # only the rows the walk reaches are processed
        if node not in distributions:
            distributions[node] = process_logits(row(node), settings)[0]
        return distributions[node]

    n_drafts = len(drafts.tokens)
    if not n_drafts:  # plain decoding: one draw from p, over its support (not the whole vocabulary)
        support, probs = sparse_distribution(row(-1), settings)
        return [], int(support[sample_token(probs, rng)])
    if settings.acceptance == "block" and n_drafts and parents == list(range(-1, n_drafts - 1)):  # a chain
        n_accepted, next_token = accept_block(
            target_probs=np.array([target_probs(node) for node in range(-1, n_drafts)]),
            draft_probs=np.array(drafts.probs).reshape(n_drafts, -1),
            draft_tokens=drafts.tokens,
            rng=rng,
        )
        return list(range(n_accepted)), next_token
    return accept_tree(
        target_probs=target_probs, draft_probs=drafts.probs, draft_tokens=drafts.tokens, parents=parents, rng=rng
    )


def _path_context(context: list[int], drafts: Drafts, parents: list[int], node: int) -> list[int]:
    """The tokens before the position that follows draft node `node` (-1: the context itself)."""
    path = []
    while node >= 0:
        path.append(drafts.tokens[node])
        node = parents[node]
    return context + path[::-1]
