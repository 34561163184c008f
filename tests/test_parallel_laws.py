"""Losslessness under concurrency: three requests interleaved through `llama.batcher` (each thread a
participant of the verifier's and the draft's batchers, its rows decoded in batches with the others')
each follow the verifier's processed law, by a chi-square test as test_laws.py's; a planted batcher
that hands each caller another sequence's rows fails the same check."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings, process_logits
from specgguf.llama.batcher import Batcher, Rows, SequenceView
from test_laws import DRAFT, TARGET, VOCAB, _p_value, _settings

PROMPTS = [[0, 1, 2, 0, 1], [3, 4, 5, 3, 4], [2, 2, 1, 0, 5]]  # three laws: the tables are bigrams
LENGTH = 3


class FakeContext:
    """One context of several sequences (a `batcher.Decoder`): each sequence's cells, logits from a
    bigram table. It checks that every caller's positions follow its own sequence's cells."""

    def __init__(self, table: np.ndarray, n_batch: int = 64):
        self.table, self.n_batch = table, n_batch
        self.cells: dict[int, list[int]] = {}
        self.n_decodes = self.n_shared = 0  # batches, and batches holding more than one sequence

    def decode(self, work: Sequence[Rows]) -> list[np.ndarray]:
        results = []
        for rows in work:
            cells = self.cells.setdefault(rows.seq, [])
            assert len(cells) == rows.start, "rows at positions their sequence does not have"
            cells.extend(rows.tokens)
            outputs = cells[len(cells) - rows.n_logits :]
            results.append(np.array([self.table[token] for token in outputs]).reshape(rows.n_logits, VOCAB))
        self.n_decodes += 1
        self.n_shared += len({rows.seq for rows in work}) > 1
        return results

    def remove(self, seq: int, start: int) -> None:
        del self.cells.setdefault(seq, [])[start:]

    def pass_line(self) -> tuple[float, float] | None:
        return None  # a fake that takes no measurable time learns no line


class MixingContext(FakeContext):
    """Planted: each caller gets the rows of the next caller with as many rows (a batch read at
    the wrong offsets)."""

    def decode(self, work: Sequence[Rows]) -> list[np.ndarray]:
        results = super().decode(work)
        mixed = list(results)
        for index, rows in enumerate(work):
            same = [other for other in range(len(work)) if work[other].n_logits == rows.n_logits]
            mixed[index] = results[same[(same.index(index) + 1) % len(same)]]
        return mixed


def _views(context: FakeContext) -> list[SequenceView]:
    batcher = Batcher(context)
    return [
        SequenceView(batcher, seq, n_ctx=4096, n_vocab=VOCAB, is_eog=lambda _token: False)
        for seq in range(len(PROMPTS))
    ]


def _law(prompt: list[int], settings: SamplingSettings) -> np.ndarray:
    """The joint law of the first LENGTH tokens of plain decoding after `prompt` (a bigram chain)."""
    law = np.zeros((VOCAB,) * LENGTH)
    for index in np.ndindex(*law.shape):
        probability, previous = 1.0, prompt[-1]
        for token in index:
            probability *= process_logits(TARGET[previous], settings)[0][token]
            previous = token
        law[index] = probability
    return law


def _run_interleaved(context_type: type[FakeContext], settings: SamplingSettings, n_sequences: int):
    """Each prompt's answers, counted, from three threads running at once; and the verifier's context."""
    verifier_context, draft_context = context_type(TARGET), context_type(DRAFT)
    verifiers, drafts = _views(verifier_context), _views(draft_context)
    counts = [np.zeros((VOCAB,) * LENGTH) for _ in PROMPTS]
    errors: list[BaseException] = []
    # Every thread joins both batchers before any decodes: a thread started first would otherwise run
    # alone for as long as the others take to start (most of a short run, on a loaded machine).
    everyone_in = threading.Barrier(len(PROMPTS))

    def answer(lane: int) -> None:
        rng = np.random.default_rng(100 + lane)
        verifier, draft = verifiers[lane], drafts[lane]
        try:
            with verifier.participant(), draft.participant():
                everyone_in.wait(timeout=60)
                for _ in range(n_sequences):
                    events = speculate(
                        verifier=verifier,
                        drafter=ModelDrafter(draft),
                        prompt_tokens=PROMPTS[lane],
                        k=FixedK(3),
                        max_tokens=LENGTH,
                        settings=settings,
                        rng=rng,
                    )
                    counts[lane][tuple(token for event in events for token in event.tokens)] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=answer, args=(lane,)) for lane in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return counts, verifier_context


def test_the_three_laws_differ():
    """The check below is only as sharp as its prompts: each one's law differs from the others'."""
    settings = _settings(1.5)
    laws = [_law(prompt, settings) for prompt in PROMPTS]
    assert min(np.abs(a - b).sum() for i, a in enumerate(laws) for b in laws[i + 1 :]) > 0.2


def test_interleaved_requests_share_batches_and_keep_their_own_rows():
    """Greedy, three threads at once each get their own prompt's answer; most batches held several sequences."""
    counts, context = _run_interleaved(FakeContext, SamplingSettings(temperature=0), n_sequences=30)
    for prompt, tally in zip(PROMPTS, counts):
        expected, previous = [], prompt[-1]
        for _ in range(LENGTH):
            previous = int(np.argmax(TARGET[previous]))
            expected.append(previous)
        assert tally[tuple(expected)] == 30
    assert context.n_shared > context.n_decodes / 2


@pytest.mark.slow
def test_interleaved_requests_each_follow_the_verifiers_law():
    settings = _settings(1.5)
    counts, context = _run_interleaved(FakeContext, settings, n_sequences=2000)
    assert context.n_shared > context.n_decodes / 2
    for prompt, tally in zip(PROMPTS, counts):
        assert _p_value(tally, _law(prompt, settings)) > 1e-4


@pytest.mark.slow
def test_a_batcher_that_mixes_rows_across_sequences_fails():
    settings = _settings(1.5)
    counts, _ = _run_interleaved(MixingContext, settings, n_sequences=2000)
    p_values = []
    for prompt, tally in zip(PROMPTS, counts):
        try:
            p_values.append(_p_value(tally, _law(prompt, settings)))
        except AssertionError:  # a sequence the law never emits: refused outright
            p_values.append(0.0)
    assert min(p_values) < 1e-12
