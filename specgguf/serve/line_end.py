"""Drafts past the line an answer ends on: an editor's completion past its time budget.

llama-server's `t_max_predict_ms` (llama.vscode sends 1,000 ms) ends a fill-in-the-middle answer at the
first token holding a new line once the budget is spent (text.time_cut). Past that point a draft after
such a token is a verify row for text the server throws away: on a compute-bound verifier each costs
about half a pass. `LineEndDrafter` cuts each proposal where `time_cut` would end the answer, by the
same rule. Drafts are proposals only: the acceptance rule, and so the answer, are untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..core.drafting import Drafter, Drafts, DraftStep, Wrapper
from .text import ends_line, time_cut


class LineEndDrafter(Wrapper):
    """`inner`, its proposals cut as `time_cut` cuts the answer once `elapsed_ms()` (None before the
    answer's first token) passes `limit_ms` (a chain's only: a tree is left whole)."""

    def __init__(
        self,
        inner: Drafter,
        *,
        token_bytes: Callable[[int], bytes],
        elapsed_ms: Callable[[], float | None],
        limit_ms: int,
    ):
        super().__init__(inner)
        self.token_bytes, self.elapsed_ms, self.limit_ms = token_bytes, elapsed_ms, limit_ms
        self.source = inner.source

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        elapsed_ms = self.elapsed_ms()
        if elapsed_ms is not None and elapsed_ms > self.limit_ms:
            # A draft model stops after the line's end too, instead of drafting what is cut here: its
            # tokens past it were a pass each (the F16 editor trace: 14 drafted, 2 kept, 0.5 s a step).
            step = dataclasses.replace(step, last=self._ends_line)
        drafts = self.inner.propose(context, k, step)
        if drafts.parents or elapsed_ms is None:
            return drafts
        kept, ends = time_cut(drafts.tokens, self.token_bytes, elapsed_ms=elapsed_ms, limit_ms=self.limit_ms)
        return drafts.cut(len(kept)) if ends else drafts  # the answer ends with its last: nothing after it is kept

    def _ends_line(self, token: int) -> bool:
        return ends_line(token, self.token_bytes)
