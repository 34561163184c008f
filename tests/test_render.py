"""Rendering reads the events' flags: colours by origin, plain text when piped, UTF-8 split across tokens."""

from __future__ import annotations

import io

from rich.console import Console

from specgguf.cli.render import TokenStream
from specgguf.core.engine import StepEvent
from specgguf.core.events import GenerationStats

PIECES = {1: b"He", 2: b"llo", 3: b" w", 4: b"orld", 5: "é".encode()[:1], 6: "é".encode()[1:], 7: b"!"}


def _event(accepted, rejected, verifier_token, source="model"):
    return StepEvent(
        accepted=accepted,
        rejected=rejected,
        verifier_token=verifier_token,
        n_drafted=len(accepted) + len(rejected),
        n_accepted=len(accepted),
        draft_seconds=0.0,
        verify_seconds=0.0,
        sample_seconds=0.0,
        draft_source=source,
    )


EVENTS = [_event([1, 2], [7], 3), _event([4], [], 5, source="ngram"), _event([], [], 6), _event([7], [], None)]


def test_terminal_colours_by_origin_and_shows_rejected_drafts():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="standard", width=200)
    stream = TokenStream(PIECES.__getitem__, console=console, out=None, show_rejected=True)
    for event in EVENTS:
        stream.write(event)
    stream.finish()
    screen = buffer.getvalue()
    assert "\x1b[32mHe" in screen  # accepted model drafts: green
    assert "\x1b[36morld" in screen  # accepted n-gram drafts: cyan
    assert "\x1b[2;9;31m!" in screen  # the rejected draft: dim, struck out, red
    assert stream.text == "Hello worldé!"  # rejected drafts are not part of the text


def test_piped_output_is_plain_and_a_split_character_is_whole():
    out = io.StringIO()
    stream = TokenStream(PIECES.__getitem__, console=None, out=out, show_rejected=True)
    for event in EVENTS:
        stream.write(event)
    stream.finish()
    assert out.getvalue() == "Hello worldé!\n" and "\x1b" not in out.getvalue()


def test_stats_count_accepted_tokens_by_drafter():
    stats = GenerationStats()
    for event in EVENTS:
        stats.add(event)
    assert stats.accepted_by_source == {"model": 3, "ngram": 1}
    assert "3 from model" in stats.summary() and "1 from ngram" in stats.summary()
    assert stats.acceptance_rate == 4 / 5


def test_merged_stats_equal_stats_of_all_events():
    first, second, together = GenerationStats(), GenerationStats(), GenerationStats()
    for event in EVENTS[:2]:
        first.add(event)
        together.add(event)
    for event in EVENTS[2:]:
        second.add(event)
        together.add(event)
    first.merge(second)
    assert first == together


def test_a_position_whose_drafts_were_all_refused_reports_zero():
    # Every draft refused (a bench run on tiny models can do this): the rate is 0, and each drafted
    # position is reported at 0, not left out (the old lists stopped at the last accepted position).
    refused = GenerationStats()
    refused.add(_event([], [7, 7, 7], 3))
    assert refused.acceptance_rate == 0.0
    assert refused.as_dict()["acceptance_by_position"] == [0.0, 0.0, 0.0]
    deep, shallow = GenerationStats(), GenerationStats()
    deep.add(_event([1], [7, 7], 3))
    shallow.add(_event([1, 2], [], 3))
    shallow.merge(deep)
    assert shallow.as_dict()["acceptance_by_position"] == [1.0, 0.5, 0.0]
    assert len(shallow.accepted_by_position) == len(shallow.drafted_by_position) == 3
