"""When a draft model starts reading: its catch-up on a long unread context (a new prompt, a long
tool result) is paid before its first draft, and on a compute-bound CPU it can cost more than its
drafts win back on a short answer. Measured on the default pair (scripts/first_token.py): after a
649-token agent prompt the 0.5B draft reads for 8 s, and the 48-token answer that plain decoding
writes in 3 s took 12 s.

The rule is ski rental's: while the draft model's unread tokens would take longer to read than the
answer has taken so far, its steps are plain (prompt lookup and a grammar's forced tokens, which
read nothing first, still draft); once the answer has run that long, it reads and drafts. An answer
shorter than the reading never pays for it, and a long one loses at most the reading's time to
waiting. Less than `LONG_READ` unread tokens (a chat's new turn) is read at once, as before.

The reading's cost per token starts as `DRAFT_READ_PRIOR` of the verifier's own reading of this
prompt (the draft is the smaller model; of what the verifier read, when its cache held the rest) and
is then what the draft's catch-ups measured."""

from __future__ import annotations

from dataclasses import dataclass

LONG_READ = 64  # unread tokens; fewer are read at once
DRAFT_READ_PRIOR = 0.5  # of the verifier's seconds a token (measured 0.57 for the 0.5B draft of the 1.5B)


@dataclass
class Reading:
    per_token: float  # seconds the draft model takes to read a token (estimated, then measured)
    waited: float = 0.0  # seconds this answer's steps have taken so far

    @classmethod
    def after_prefill(cls, seconds: float, n_read: int) -> Reading:
        """The prior from the verifier's reading of the prompt, however short. A short read costs more a
        token than a long one, so the prior errs towards waiting, and it matters only where the draft has
        more than `LONG_READ` tokens unread: a prompt whose start the verifier's cache held (a server's
        tools and system prompt, read for an earlier request) and the draft model never read. With no
        prior there, the draft read a 300-token tools prompt before a 37-token answer: 0.42x plain."""
        return cls(DRAFT_READ_PRIOR * seconds / n_read if n_read else 0.0)

    def defers(self, unread: int) -> bool:
        """A draft model's step waits: its reading would take longer than the answer has so far."""
        return unread > LONG_READ and unread * self.per_token > self.waited

    def observe(self, step_seconds: float, catchup_seconds: float, n_read: int) -> None:
        """A step took `step_seconds`; the draft read `n_read` tokens in `catchup_seconds` of it."""
        self.waited += step_seconds
        if catchup_seconds > 0 and n_read >= LONG_READ:
            self.per_token = catchup_seconds / n_read
