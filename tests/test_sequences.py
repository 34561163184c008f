"""Several sequences in one real llama.cpp context (llama/sequences.py, serve --parallel): greedy
answers to four requests at once, their rows decoded in shared batches, equal each one's answer
alone, token for token (tiny GGUF pair)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.llama.batcher import Rows
from specgguf.llama.model import LlamaModel

PROMPTS = ["the cat sat on", "a dog and the sea", "the cat and the dog and the", "once"]
GREEDY = SamplingSettings(temperature=0)


def _answer(verifier, draft, prompt: list[int], k: int) -> list[int]:
    drafter = ModelDrafter(draft) if draft is not None else None
    events = speculate(
        verifier=verifier,
        drafter=drafter,
        prompt_tokens=prompt,
        k=FixedK(k),
        max_tokens=40,
        settings=GREEDY,
        rng=np.random.default_rng(0),
    )
    return [token for event in events for token in event.tokens]


@pytest.mark.parametrize("k", [0, 3])
def test_four_requests_at_once_answer_as_each_alone(tiny_verifier, tiny_draft, k):
    verifier = LlamaModel(tiny_verifier, n_ctx=256, n_threads=1)
    draft = LlamaModel(tiny_draft, n_ctx=256, n_threads=1)
    prompts = [verifier.tokenize(text) for text in PROMPTS]
    alone = []
    for prompt in prompts:
        verifier.clear()
        draft.clear()
        alone.append(_answer(verifier, draft, prompt, k))
    verifiers, drafts = verifier.sequences(4), draft.sequences(4)
    assert verifier.n_ctx == 256 and verifiers[0].max_leaves == 1  # each sequence its own n_ctx; no trees
    together: list[list[int] | None] = [None] * 4

    def run(lane: int) -> None:
        with verifiers[lane].participant(), drafts[lane].participant():
            together[lane] = _answer(verifiers[lane], drafts[lane], prompts[lane], k)

    threads = [threading.Thread(target=run, args=(lane,)) for lane in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    batcher = verifiers[0].batcher
    assert batcher.n_rows > batcher.n_decodes  # batches held rows of several sequences
    # A second round on the same sequences: each keeps its own cache (the prompt's prefix is reused).
    for lane in range(4):
        assert verifiers[lane].cached[: len(prompts[lane])] == prompts[lane]
    verifier.close()
    draft.close()


def test_a_sequence_rewinds_only_its_own_cells(tiny_verifier):
    model = LlamaModel(tiny_verifier, n_ctx=128, n_threads=1)
    first, second = model.sequences(2)
    tokens = model.tokenize("the cat sat on the mat")
    expected = first.eval(tokens, n_logits=1)
    second.eval(tokens, n_logits=1)
    second.rewind(2)  # the other sequence's cells stay
    assert second.n_past == 2 and first.n_past == len(tokens)
    first.rewind(len(tokens) - 1)
    again = first.eval(tokens[-1:], n_logits=1)
    np.testing.assert_allclose(again, expected, atol=1e-3)  # its cells are all there (batch sizes round apart)
    second.clear()
    assert second.cached == [] and first.n_past == len(tokens)
    model.close()


def test_calibrated_sequences_know_the_pass_line_and_start_empty(tiny_verifier):
    model = LlamaModel(tiny_verifier, n_ctx=128, n_threads=1)
    tokens = model.tokenize("the cat sat on the mat")
    first, _ = model.sequences(2)
    expected = first.eval(tokens, n_logits=2)
    views = model.sequences(2, calibrate=True)
    decoder = views[0].batcher.decoder
    assert [(passes, rows) for passes, rows, _ in decoder.costs.seen] == [(1, n) for n in (1, 4, 8, 16) * 2]
    assert all(seconds > 0 for *_, seconds in decoder.costs.seen)  # (the line itself: a tiny model's noise)
    # The calibration's cells are gone: sequence 0 answers as one never calibrated.
    assert decoder._next_position(0) == 0 and views[0].n_past == 0
    np.testing.assert_allclose(views[0].eval(tokens, n_logits=2), expected, atol=1e-4)
    model.close()


def test_filler_rows_make_one_pass_and_leave_every_sequence_as_it_was(tiny_verifier, monkeypatch):
    """Rows 4, 4, 1, 4 (llama.cpp's three passes) and sequences 0 and 2 without 1 (two): with the costs
    of a memory-bound verifier the decoder adds filler rows (llama/sequences.py) and decodes one pass;
    each real row's logits are those of its sequence decoded alone, and the fillers' cells are gone."""
    model = LlamaModel(tiny_verifier, n_ctx=128, n_threads=1)
    views = model.sequences(4)
    decoder = views[0].batcher.decoder
    monkeypatch.setattr(decoder.costs, "line", lambda: (0.1, 0.005))
    prompts = [model.tokenize(text) for text in PROMPTS]
    for view, prompt in zip(views, prompts):
        view.eval(prompt, n_logits=1)
    steps = [[5, 6, 7, 8], [9, 10, 11, 12], [13], [14, 15, 16, 17]]
    alone = {}
    for view, step in zip(views, steps):
        alone[view.seq] = view.eval(step, n_logits=len(step))
        view.rewind(view.n_past - len(step))
    for chosen in ([0, 1, 2, 3], [0, 2]):
        work = [Rows(seq, views[seq].n_past, steps[seq], len(steps[seq])) for seq in reversed(chosen)]
        together = decoder.decode(work)
        assert decoder.costs.seen[-1][:2] == (1, 16 if len(chosen) == 4 else 12)  # one pass, fillers counted
        for rows, logits in zip(work, together):
            np.testing.assert_allclose(logits, alone[rows.seq], atol=1e-4)  # batch sizes round apart
            decoder.remove(rows.seq, rows.start)
        for view, prompt in zip(views, prompts):  # the fillers' cells are gone: each holds its prompt
            assert decoder._next_position(view.seq) == len(prompt)
    model.close()
