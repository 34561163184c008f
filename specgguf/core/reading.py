"""When a draft model starts reading: its catch-up on a long unread context (a new prompt, a long
tool result) is paid before its first draft, and on a compute-bound CPU it can cost more than its
drafts win back on a short answer. Measured on the default pair (scripts/first_token.py): after a
649-token agent prompt the 0.5B draft reads for 8 s, and the 48-token answer that plain decoding
writes in 3 s took 12 s.

The rule is ski rental's. Reading is the purchase, R seconds; not having read is the rent: while the
draft's steps are plain (prompt lookup and a grammar's forced tokens, which read nothing first, still
draft), each second of the answer loses what drafting would have saved of it, 1 − 1/s for drafting
at s times plain decoding's rate (the K policy's estimate, `KPolicy.speedup`). The draft reads once
the rent paid reaches the price: waited · (1 − 1/s) ≥ R. An answer too short to pay the reading back
never reads, and a long one loses at most the reading's time to waiting, whatever s turns out to be;
where s ≤ 1 (drafting from the model cannot win here) it never reads. With s unknown (a fixed K)
the rent is the whole of each second, as if drafting were free and sure. Measured on the F16
verifier: a chat's fifth turn (1,154 tokens the draft never read) read for 4.6 s after 120 of its 147
tokens, drafting at about 1.3× where it paid nothing back: 0.68× plain; with the rent the draft never
reads there. Less than `LONG_READ` unread tokens (a chat's new turn) is read at once, as before.

The reading's cost per token starts as the draft's own reading timed once on this machine (tuning.probe,
kept in tuning.json), or where that is not known `DRAFT_READ_PRIOR` of the verifier's own reading of
this prompt (the draft is the smaller model; of what the verifier read, when its cache held the rest),
and is then what the draft's catch-ups measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

LONG_READ = 64  # unread tokens; fewer are read at once
DRAFT_READ_PRIOR = 0.5  # of the verifier's seconds a token (measured 0.57 for the 0.5B draft of the 1.5B)


@dataclass
class Reading:
    per_token: float  # seconds the draft model takes to read a token (estimated, then measured)
    waited: float = 0.0  # seconds this answer's steps have taken so far

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
        """A draft model's step waits: reading `unread` tokens costs more than not having read them has
        cost so far, the answer's seconds times the share 1 − 1/s of them drafting would save, s =
        `speedup()` (asked only for a long read: most steps have none, and the policy's estimate is not
        free)."""
        if unread <= LONG_READ:
            return False
        s = speedup()
        rent = 1.0 if s is None else max(0.0, 1.0 - 1.0 / s)
        return unread * self.per_token >= self.waited * rent

    def observe(self, step_seconds: float, catchup_seconds: float, n_read: int) -> None:
        """A step took `step_seconds`; the draft read `n_read` tokens in `catchup_seconds` of it."""
        self.waited += step_seconds
        if catchup_seconds > 0 and n_read >= LONG_READ:
            self.per_token = catchup_seconds / n_read
