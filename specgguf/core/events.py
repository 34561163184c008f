"""What the loop yields: one `StepEvent` per verify pass, made from the step's parts."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .drafting import Drafts, Source
from .model import Model
from .verify_tree import VerifyTree


@dataclass(frozen=True)
class StepSeconds:
    """Where one step's time went."""

    draft: float  # the drafter's proposal
    verify: float  # the verifier's batched pass
    sample: float  # acceptance, sampling, rolling the caches back
    prefill: float = 0.0  # prompt ingestion, on the first step only


@dataclass
class StepEvent:
    """What one step produced, in output order: accepted drafts, then the verifier's token (scored by the
    step's verify pass; on the first step, row 0 is the prompt pass's)."""

    accepted: list[int]  # draft tokens the verifier kept (end-of-generation tokens left out)
    rejected: list[int]  # draft tokens thrown away; the first is the one the verifier refused
    verifier_token: int | None  # replacement or bonus token; None if generation ended before it
    n_drafted: int
    n_accepted: int  # counts an accepted end-of-generation draft too, for acceptance stats
    draft_seconds: float
    verify_seconds: float
    sample_seconds: float
    prefill_seconds: float = 0.0  # prompt ingestion, on the first event only
    draft_source: Source | None = None  # who proposed the drafts: "model", "ngram" or "grammar"
    draft_confidence: list[float] = field(default_factory=list)  # the draft model's top probability per draft
    draft_catchup_seconds: float = 0.0  # of draft_seconds: the draft reading tokens decoded without it
    draft_text_seconds: float = 0.0  # of draft_seconds: the string-level drafter's decode and re-encode
    stop: str | None = None  # "eos", "max_tokens" or "context" on the last event
    # A tree step: siblings checked beside the chain, and kept (n_drafted and n_accepted count
    # them too), and for each sibling whose parent was kept: (runner-up probability, taken).
    n_siblings: int = 0
    siblings_accepted: int = 0
    sides: list[tuple[float, bool]] = field(default_factory=list)
    # The verifier's raw logits for each of `tokens` (row i scored token i), from the verify pass
    # itself: log-probabilities at no extra model cost. None on an event that emitted nothing.
    target_logits: np.ndarray | None = None

    @property
    def chain_drafted(self) -> int:
        """Drafts along the chain the draft model proposed (siblings left out)."""
        return self.n_drafted - self.n_siblings

    @property
    def chain_accepted(self) -> int:
        return self.n_accepted - self.siblings_accepted

    @property
    def tokens(self) -> list[int]:
        return self.accepted + ([] if self.verifier_token is None else [self.verifier_token])


def step_event(
    emitted: list[int],
    drafts: Drafts,
    path: list[int],
    tree: VerifyTree,
    target_logits: np.ndarray,
    verifier: Model,
    tokens_left: int,
    seconds: StepSeconds,
) -> StepEvent:
    """The step's event, complete: output up to an end-of-generation token, and why it stopped
    (`tokens_left`: how many the answer could still take before this step)."""
    eog_at = next((i for i, token in enumerate(emitted) if verifier.is_eog(token)), None)
    kept = emitted if eog_at is None else emitted[:eog_at]
    stop = "eos" if eog_at is not None else "max_tokens" if len(kept) >= tokens_left else None
    n_accepted, on_path, parents = len(path), set(path), drafts.tree()
    chain = [node for node in range(len(drafts.tokens)) if node not in drafts.sides]
    return StepEvent(
        # At an end-of-generation token everything kept counts as accepted: the verifier's own
        # token, if it was not the end itself, never comes.
        accepted=kept if eog_at is not None else kept[:n_accepted],
        rejected=[drafts.tokens[node] for node in chain if node not in on_path],
        verifier_token=None if eog_at is not None else kept[-1],
        n_drafted=tree.n_checked,
        n_accepted=n_accepted,
        draft_seconds=seconds.draft,
        verify_seconds=seconds.verify,
        sample_seconds=seconds.sample,
        prefill_seconds=seconds.prefill,
        draft_source=drafts.source if drafts.tokens else None,
        draft_confidence=drafts.confidence,
        draft_catchup_seconds=drafts.catchup_seconds,
        draft_text_seconds=drafts.text_seconds,
        stop=stop,
        # The rows that scored `emitted`: log-probabilities at no extra model cost.
        target_logits=_rows(target_logits, [tree.row(node) for node in [-1, *path]][: len(kept)]),
        n_siblings=tree.n_checked - len(chain),
        siblings_accepted=n_accepted - sum(node in on_path for node in chain),
        sides=[
            (runner_up, node in on_path)
            for node, runner_up in drafts.sides.items()
            if parents[node] < 0 or parents[node] in on_path
        ],
    )


def _rows(logits: np.ndarray, rows: list[int]) -> np.ndarray:
    """logits[rows]; a view where the rows run in order (a chain's path: no copy of vocabulary-wide rows)."""
    start = rows[0] if rows else 0
    if rows == list(range(start, start + len(rows))):
        return logits[start : start + len(rows)]
    return logits[rows]


def stop_event(reason: str, prefill_seconds: float) -> StepEvent:
    """A step that emits nothing: the answer stops (no room left in the context)."""
    return StepEvent(accepted=[], rejected=[], verifier_token=None, n_drafted=0, n_accepted=0, draft_seconds=0.0,
                     verify_seconds=0.0, sample_seconds=0.0, prefill_seconds=prefill_seconds, stop=reason)  # fmt: skip
