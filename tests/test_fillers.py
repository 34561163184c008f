"""Filler rows (llama/sequences.py): how llama.cpp cuts a batch of several sequences into passes, and
when rows added after a sequence's own make it one pass for less."""

from __future__ import annotations

from specgguf.llama.sequences import fillers, passes

ROOM = 1000


def test_passes_follow_llama_cpps_equal_split():
    assert passes({0: 4, 1: 4, 2: 4, 3: 4}) == [16]
    assert passes({0: 4, 1: 4, 2: 1, 3: 4}) == [4, 6, 3]  # 4x1, then sequences 0-1 x3, then 3 x3
    assert passes({0: 4, 2: 4}) == [4, 4]  # not consecutive: a pass each
    assert passes({1: 1, 2: 5}) == [2, 4]
    assert passes({3: 2}) == [2] and passes({}) == [] and passes({0: 0, 1: 3}) == [3]


def test_a_memory_bound_pass_takes_fillers_to_be_one():
    memory_bound = (0.1, 0.005)  # a pass reads the weights: 20 rows' worth
    assert fillers({0: 4, 1: 4, 2: 1, 3: 4}, room=lambda seq: ROOM, n_batch=512, line=memory_bound) == {2: 3}
    # A sequence between two others (idle, or drafting now) gets rows of its own.
    assert fillers({0: 4, 2: 4}, room=lambda seq: ROOM, n_batch=512, line=memory_bound) == {1: 4}
    assert fillers({0: 1, 1: 1, 3: 1}, room=lambda seq: ROOM, n_batch=512, line=memory_bound) == {2: 1}


def test_fillers_only_where_they_cost_less_than_the_passes_they_save():
    compute_bound = (0.01, 0.02)  # half a row's worth per pass
    assert fillers({0: 4, 1: 4, 2: 1, 3: 4}, room=lambda seq: ROOM, n_batch=512, line=compute_bound) == {}
    # 1 filler row (0.02 s) against a second pass (0.01 s): not worth it either.
    assert fillers({0: 1, 2: 1}, room=lambda seq: ROOM, n_batch=512, line=compute_bound) == {}
    assert fillers({0: 2, 1: 2}, room=lambda seq: ROOM, n_batch=512, line=compute_bound) == {}  # one pass already
    # Before the costs are learned, a pass is guessed worth one row: a prompt beside a step is left alone.
    assert fillers({0: 200, 1: 1}, room=lambda seq: ROOM, n_batch=512, line=None) == {}
    assert fillers({0: 2, 1: 2, 2: 1, 3: 2}, room=lambda seq: ROOM, n_batch=512, line=None) == {2: 1}  # 3 passes


def test_no_fillers_past_a_sequences_room_or_the_batch():
    memory_bound = (0.1, 0.005)
    rows = {0: 4, 1: 4, 2: 1, 3: 4}
    assert fillers(rows, room=lambda seq: 2 if seq == 2 else ROOM, n_batch=512, line=memory_bound) == {}
    assert fillers(rows, room=lambda seq: ROOM, n_batch=15, line=memory_bound) == {}
