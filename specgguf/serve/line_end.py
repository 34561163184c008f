"""Drafts past the line an answer ends on: an editor's completion past its time budget.

llama-server's `t_max_predict_ms` (llama.vscode sends 1,000 ms) ends a fill-in-the-middle answer at the
first token holding a new line once the budget is spent (text.time_cut). Past that point a draft after
such a token is a verify row for text the server throws away: on a compute-bound verifier each costs
about half a pass. `LineEndDrafter` cuts each proposal after its first new line once the budget is
spent. Drafts are proposals only: the acceptance rule, and so the answer, are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.drafting import Drafter, Drafts, DraftStep, Source


class LineEndDrafter:
    """`inner`, its proposals cut after the first token holding a new line while `spent()` says the
    answer's time budget is spent (a chain's only: a tree is left whole)."""

    def __init__(self, inner: Drafter, *, token_bytes: Callable[[int], bytes], spent: Callable[[], bool]):
        self.inner, self.token_bytes, self.spent = inner, token_bytes, spent
        self.source: Source = inner.source

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self.inner.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.inner.room(context_length)

    def next_source(self, context: list[int]) -> Source:
        return self.inner.next_source(context)

    def unread(self, context: list[int]) -> int:
        return self.inner.unread(context)

    def propose(self, context: list[int], k: int, step: DraftStep) -> Drafts:
        drafts = self.inner.propose(context, k, step)
        if drafts.parents or not self.spent():
            return drafts
        for i, token in enumerate(drafts.tokens):
            if b"\n" in self.token_bytes(token):
                return drafts.cut(i + 1)  # the answer ends with this token: nothing after it is kept
        return drafts

    def sync(self, context: list[int]) -> None:
        self.inner.sync(context)
