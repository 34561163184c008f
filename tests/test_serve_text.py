"""Stop strings cut the answer exactly, even inside one step's burst of tokens or across steps."""

from __future__ import annotations

import pytest

from specgguf.serve.text import AnswerText

# A toy vocabulary: token i stands for PIECES[i] (as bytes; 5 and 6 are halves of "é").
PIECES = [b"Hello", b" wor", b"ld", b"!", b" STO", b"\xc3", b"\xa9", b"P", b" more"]


def token_bytes(token: int) -> bytes:
    return PIECES[token]


def stream(steps: list[list[int]], stops: list[str]) -> tuple[list[str], AnswerText]:
    answer = AnswerText(token_bytes, stops)
    deltas = [answer.add(step) for step in steps]
    deltas.append(answer.finish())
    return deltas, answer


def test_without_stop_strings_every_step_is_handed_out_whole():
    deltas, answer = stream([[0, 1], [2, 3]], [])
    assert deltas == ["Hello wor", "ld!", ""]
    assert answer.text == "Hello world!" and not answer.stopped
    assert answer.n_tokens_used(False) == 4


def test_a_stop_string_inside_one_burst_cuts_there_and_drops_the_rest_of_the_burst():
    deltas, answer = stream([[0, 1, 2, 3, 8]], ["ld!"])
    assert "".join(deltas) == "Hello wor" and answer.stopped
    assert answer.text == "Hello wor"
    assert answer.n_tokens_used(True) == 3  # up to "ld", where the stop string starts


def test_a_stop_string_split_across_steps_is_held_back_and_never_leaks():
    deltas, answer = stream([[0, 4], [7, 8]], [" STOP"])
    assert deltas[0] == "Hello"  # " STO" could start " STOP": held back
    assert "".join(deltas) == "Hello" and answer.stopped


def test_held_back_text_is_released_when_it_turns_out_not_to_be_a_stop_string():
    deltas, answer = stream([[0, 4], [8]], [" STOP"])
    assert deltas == ["Hello", " STO more", ""]
    assert not answer.stopped and answer.text == "Hello STO more"


def test_held_back_text_is_released_at_the_end():
    deltas, _ = stream([[0, 4]], [" STOP"])
    assert deltas == ["Hello", " STO"]


def test_a_character_split_across_tokens_appears_whole():
    deltas, _ = stream([[0, 5], [6, 3]], [])
    assert deltas == ["Hello", "é!", ""]


def test_the_earliest_of_several_stop_strings_wins():
    deltas, answer = stream([[0, 1, 2, 3]], ["!", "wor"])
    assert "".join(deltas) == "Hello " and answer.text == "Hello "


@pytest.mark.parametrize("split", range(1, 5))
def test_the_cut_does_not_depend_on_how_tokens_are_grouped_into_steps(split):
    tokens = [0, 1, 2, 3, 8]
    deltas, answer = stream([tokens[:split], tokens[split:]], ["rld"])
    assert "".join(deltas) == "Hello wo" == answer.text


def test_bytes_that_are_not_utf8_show_as_replacement_characters():
    _, answer = stream([[0, 1, 6, 2]], [])  # a lone continuation byte
    assert answer.text == "Hello wor\ufffdld"


def test_tokens_are_shown_as_their_text_is_handed_out():
    answer = AnswerText(token_bytes, [" STOP"])
    assert answer.add([0, 4]) == "Hello" and answer.n_tokens_shown() == 1  # " STO" held back
    assert answer.add([8]) == " STO more" and answer.n_tokens_shown() == 3
    answer = AnswerText(token_bytes, ["orl"])
    answer.add([0, 1, 2, 3])
    assert answer.text == "Hello w" and answer.n_tokens_shown() == 2  # " wor" started before the cut


def test_token_logprobs_are_the_log_softmax_of_the_raw_logits():
    import numpy as np

    from specgguf.serve.text import token_logprobs

    rows = np.array([[2.0, 1.0, 0.0, -1.0, 0.5, 0.0, 0.0, 0.0, 0.0], [0.0] * 9])
    entries = token_logprobs(rows, [1, 3], n_top=2, token_bytes=token_bytes)
    expected = rows[0] - np.log(np.exp(rows[0]).sum())
    assert entries[0].token == b" wor" and entries[0].logprob == pytest.approx(expected[1])
    assert entries[0].top == [(b"Hello", pytest.approx(expected[0])), (b" wor", pytest.approx(expected[1]))]
    assert entries[1].logprob == pytest.approx(-np.log(9))
    assert token_logprobs(rows, [1, 3], n_top=0, token_bytes=token_bytes)[0].top == []


def test_the_stop_string_that_ended_the_answer_is_named():
    _, answer = stream([[0, 1, 2], [4, 7, 8]], ["xyz", " STOP", "world"])
    assert answer.stopped and answer.text == "Hello " and answer.matched == "world"  # the earliest one
    _, plain = stream([[0, 1, 2]], ["xyz"])
    assert plain.matched is None


def test_fims_time_limit_ends_the_answer_at_the_first_new_line_after_it_even_inside_a_step():
    """llama-server checks `t_max_predict_ms` token by token: a step of several tokens is cut right
    after the first one whose text holds a new line once the limit has passed, not at the step's end."""
    from specgguf.serve.text import time_cut

    pieces = {0: b"a = 1", 1: b"\n", 2: b"b", 3: b" = 2\n", 4: b"c"}
    step = [0, 1, 2, 3, 4]
    assert time_cut(step, pieces.__getitem__, elapsed_ms=499.0, limit_ms=500) == (step, False)
    assert time_cut(step, pieces.__getitem__, elapsed_ms=501.0, limit_ms=500) == ([0, 1], True)
    assert time_cut([2, 3, 4], pieces.__getitem__, elapsed_ms=501.0, limit_ms=500) == ([2, 3], True)
    assert time_cut([0, 2, 4], pieces.__getitem__, elapsed_ms=9e9, limit_ms=500) == ([0, 2, 4], False)  # no line ends
