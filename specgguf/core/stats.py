"""Running totals over the engine's step events: what the stats line and --json report."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from .engine import StepEvent


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
        # Positions along the chain (a sibling sits beside a chain position, not after it).
        for counts, n in (
            (self.drafted_by_position, event.chain_drafted),
            (self.accepted_by_position, event.chain_accepted),
        ):
            counts.extend([0] * (n - len(counts)))
            for position in range(n):
                counts[position] += 1

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
        for mine, theirs in (
            (self.drafted_by_position, other.drafted_by_position),
            (self.accepted_by_position, other.accepted_by_position),
        ):
            mine.extend([0] * (len(theirs) - len(mine)))
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
