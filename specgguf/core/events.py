"""One verify pass and what it leaves: the verifier's batch for a step (`VerifyTree`), what the loop
yields (one `StepEvent` per pass, made from the step's parts), and the running totals over those events
that the stats line and --json report (`GenerationStats`, driven by `Generation`)."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import numpy as np

from .drafting import Drafts, Source
from .model import Model


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
    draft_catchup_tokens: int = 0  # ... how many it read
    draft_read_ahead: int = 0  # chain drafts whose row the draft model read ahead (no pass of their own)
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
        draft_catchup_tokens=drafts.catchup_tokens,
        draft_read_ahead=drafts.read_ahead,
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


@dataclass
class GenerationStats:
    n_tokens: int = 0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    draft_seconds: float = 0.0
    draft_text_seconds: float = 0.0  # of draft_seconds: the string-level drafter's text round trip
    verify_seconds: float = 0.0
    sample_seconds: float = 0.0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0  # generation only, prompt ingestion excluded; set by the caller
    stop: str | None = None
    n_plain_steps: int = 0  # steps that drafted nothing
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # "model" / "ngram" -> accepted tokens
    accepted_by_position: list[int] = field(default_factory=list)  # drafts accepted at position i
    drafted_by_position: list[int] = field(default_factory=list)
    n_siblings: int = 0  # draft trees: runner-ups checked beside the chain (counted in n_drafted) ...
    siblings_accepted: int = 0  # ... and taken

    def add(self, event: StepEvent) -> None:
        self.n_tokens += len(event.tokens)
        stepped = bool(event.n_drafted or event.tokens)
        self.n_steps += stepped
        self.n_plain_steps += stepped and not event.n_drafted
        if event.n_accepted and event.draft_source is not None:  # a step that accepted drafts names their source
            self.accepted_by_source[event.draft_source] = (
                self.accepted_by_source.get(event.draft_source, 0) + event.n_accepted
            )
        self.n_drafted += event.n_drafted
        self.n_accepted += event.n_accepted
        self.draft_seconds += event.draft_seconds
        self.draft_text_seconds += event.draft_text_seconds
        self.verify_seconds += event.verify_seconds
        self.sample_seconds += event.sample_seconds
        self.prefill_seconds += event.prefill_seconds
        self.stop = event.stop or self.stop
        self.n_siblings += event.n_siblings
        self.siblings_accepted += event.siblings_accepted
        # Positions along the chain (a sibling sits beside a chain position, not after it); both
        # lists as long as the deepest draft, so a position whose drafts were all refused counts 0.
        self._widen(event.chain_drafted)
        for position in range(event.chain_drafted):
            self.drafted_by_position[position] += 1
        for position in range(event.chain_accepted):
            self.accepted_by_position[position] += 1

    def _widen(self, depth: int) -> None:
        width = max(depth, len(self.drafted_by_position), len(self.accepted_by_position))
        for counts in (self.drafted_by_position, self.accepted_by_position):
            counts.extend([0] * (width - len(counts)))

    def merge(self, other: GenerationStats) -> None:
        """Add another run's totals to these (bench sums its runs per setting)."""
        for name in (
            "n_tokens",
            "n_steps",
            "n_drafted",
            "n_accepted",
            "n_plain_steps",
            "draft_seconds",
            "draft_text_seconds",
            "verify_seconds",
            "sample_seconds",
            "prefill_seconds",
            "wall_seconds",
            "n_siblings",
            "siblings_accepted",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for source, n in other.accepted_by_source.items():
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + n
        self._widen(max(len(other.drafted_by_position), len(other.accepted_by_position)))
        for mine, theirs in (
            (self.drafted_by_position, other.drafted_by_position),
            (self.accepted_by_position, other.accepted_by_position),
        ):
            for position, count in enumerate(theirs):
                mine[position] += count
        self.stop = other.stop or self.stop

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafts / proposed drafts; None when nothing was drafted (plain decoding)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per verifier forward pass (1.0 for plain decoding)."""
        return self.n_tokens / self.n_steps if self.n_steps else 0.0

    @property
    def other_seconds(self) -> float:
        """Time outside the draft and verify calls: sampling, acceptance, rollback, rendering."""
        return max(0.0, self.wall_seconds - self.draft_seconds - self.verify_seconds)

    def summary(self) -> str:
        acceptance = (
            f"acceptance {self.acceptance_rate:.0%} ({self.n_accepted}/{self.n_drafted})"
            if self.acceptance_rate is not None
            else "plain decoding"
        )
        if self.n_siblings:
            acceptance += f" (tree siblings: {self.siblings_accepted}/{self.n_siblings} taken)"
        if len(self.accepted_by_source) > 1:
            acceptance += (
                " [" + ", ".join(f"{n} from {source}" for source, n in sorted(self.accepted_by_source.items())) + "]"
            )
        return (
            f"{self.n_tokens} tokens in {self.wall_seconds:.2f} s · {self.tokens_per_second:.1f} tok/s"
            f" · {acceptance} · {self.tokens_per_step:.2f} tokens/step"
            f" · draft {self.draft_seconds:.2f} s, verify {self.verify_seconds:.2f} s,"
            f" other {self.other_seconds:.2f} s · prompt {self.prefill_seconds:.2f} s"
        )

    def as_dict(self) -> dict:
        return {
            "n_tokens": self.n_tokens,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            "tokens_per_step": round(self.tokens_per_step, 3),
            "n_steps": self.n_steps,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "n_plain_steps": self.n_plain_steps,
            "n_siblings": self.n_siblings,
            "siblings_accepted": self.siblings_accepted,
            "accepted_by_source": dict(self.accepted_by_source),
            "acceptance_by_position": [
                round(a / d, 4) for a, d in zip(self.accepted_by_position, self.drafted_by_position)
            ],
            "seconds": {
                "generation": round(self.wall_seconds, 4),
                "prompt": round(self.prefill_seconds, 4),
                "draft": round(self.draft_seconds, 4),
                "verify": round(self.verify_seconds, 4),
                "other": round(self.other_seconds, 4),
            },
            "stop_reason": self.stop,
        }


class Generation:
    """One answer through the engine, as every command drives it: iterate it for the step events;
    each is added to `stats` as it comes, the first token's time is stamped, and when the events
    end (or the caller stops early, or closes it) `stats.wall_seconds` is the generation's time,
    prompt ingestion left out. The engine stops at a step boundary: both caches stay consistent."""

    def __init__(self, events: Generator[StepEvent, None, None], stats: GenerationStats | None = None):
        self.stats = stats if stats is not None else GenerationStats()
        self.first_token_at: float | None = None  # time.perf_counter() when the first token came
        self._events = events
        self._iterator = self._drive()

    def __iter__(self) -> Iterator[StepEvent]:
        return self._iterator

    def _drive(self) -> Generator[StepEvent, None, None]:
        start = time.perf_counter()
        try:
            for event in self._events:
                self.stats.add(event)
                if event.tokens and self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                yield event
        finally:
            self._events.close()
            self.stats.wall_seconds = max(0.0, time.perf_counter() - start - self.stats.prefill_seconds)

    def close(self) -> None:
        self._iterator.close()
        self._events.close()
