"""serve/line_end.py: past a fill-in-the-middle answer's time budget, no draft after the line it ends on."""

from __future__ import annotations

import numpy as np

from specgguf.core.drafting import Drafts, DraftStep, fixed_drafts
from specgguf.core.sampling import SamplingSettings
from specgguf.serve.line_end import LineEndDrafter
from specgguf.serve.text import time_cut

TEXT = {1: b"x = ", 2: b"1", 3: b"\n", 4: b"y", 5: b" = 2\n", 6: b"z"}


class _Proposes:
    """A drafter that proposes the given tokens (a chain), or a tree of them."""

    source = "ngram"

    def __init__(self, tokens: list[int], *, tree: bool = False):
        self.tokens, self.tree = tokens, tree
        self.calls: list[tuple] = []

    def propose(self, context, k, step):
        self.calls.append(("propose", k))
        drafts = fixed_drafts(self.tokens[:k], step, "ngram")
        if self.tree:
            drafts.parents = [-1, 0, 0][: len(drafts.tokens)]
        return drafts

    def __getattr__(self, name):  # prepare, room, next_source, unread, sync: recorded, passed on
        return lambda *args: self.calls.append((name, *args)) or 7


def _step() -> DraftStep:
    return DraftStep(n_vocab=8, settings=SamplingSettings(temperature=0.0), rng=np.random.default_rng(0))


def test_past_the_budget_a_proposal_ends_with_its_first_new_line():
    elapsed: list[float | None] = [None]
    inner = _Proposes([4, 5, 6, 1, 3, 2])
    drafter = LineEndDrafter(inner, token_bytes=TEXT.__getitem__, elapsed_ms=lambda: elapsed[0], limit_ms=1)
    assert drafter.propose([1], 6, _step()).tokens == [4, 5, 6, 1, 3, 2]  # before the first token: whole
    elapsed[0] = 1
    assert drafter.propose([1], 6, _step()).tokens == [4, 5, 6, 1, 3, 2]  # within the budget: whole
    elapsed[0] = 2
    cut = drafter.propose([1], 6, _step())
    assert cut.tokens == [4, 5]  # " = 2\n" ends the answer (text.time_cut keeps it, nothing after)
    assert time_cut([4, 5, 6, 1, 3, 2], TEXT.__getitem__, elapsed_ms=2, limit_ms=1)[0] == cut.tokens
    assert drafter.propose([1], 1, _step()).tokens == [4]  # no new line in it: as proposed
    # A tree is left whole; the rest of the protocol is the inner drafter's.
    tree = LineEndDrafter(
        _Proposes([5, 6, 4], tree=True), token_bytes=TEXT.__getitem__, elapsed_ms=lambda: 2, limit_ms=1
    )
    assert tree.propose([1], 3, _step()).tokens == [5, 6, 4]
    drafter.prepare([1, 2])
    assert drafter.room(10) == 7 and drafter.unread([1]) == 7 and drafter.source == "ngram"
    drafter.sync([1, 2, 3])
    assert ("prepare", [1, 2]) in inner.calls and ("sync", [1, 2, 3]) in inner.calls


def test_a_cut_chain_keeps_its_rows_in_step():
    drafts = Drafts(tokens=[4, 5, 6], probs=[np.ones(8)] * 3, confidence=[0.9, 0.8, 0.7], masks=[None] * 4)
    drafter = LineEndDrafter(_Fixed(drafts), token_bytes=TEXT.__getitem__, elapsed_ms=lambda: 2, limit_ms=1)
    cut = drafter.propose([1], 3, _step())
    assert cut.tokens == [4, 5] and len(cut.probs) == len(cut.confidence) == 2 and len(cut.masks) == 3


class _Fixed:
    source = "model"

    def __init__(self, drafts: Drafts):
        self.drafts = drafts

    def propose(self, context, k, step):
        return self.drafts


def test_past_the_budget_a_draft_model_stops_after_the_line_end_instead_of_drafting_what_is_cut():
    from fakes import FakeModel, one_hot_logits
    from specgguf.core.model_drafter import ModelDrafter

    chain = {1: 4, 4: 5, 5: 6, 6: 1}  # the draft writes "y = 2\n" "z" "x = " "y" ...
    elapsed: list[float | None] = [0.5]
    model = FakeModel(one_hot_logits(lambda context: chain[context[-1]], 8), n_vocab=8)
    drafter = LineEndDrafter(
        ModelDrafter(model), token_bytes=TEXT.__getitem__, elapsed_ms=lambda: elapsed[0], limit_ms=1
    )
    assert drafter.propose([1], 6, _step()).tokens == [4, 5, 6, 1, 4, 5]  # within the budget: every token
    elapsed[0] = 2
    model.rewind(0)
    before = len(model.eval_calls)
    assert drafter.propose([1], 6, _step()).tokens == [4, 5]
    assert len(model.eval_calls) - before == 2  # a pass for each kept draft, none for what would be cut
