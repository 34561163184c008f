"""The stream's draft marks (serve/draft_marks.py): the text handed out, whatever its boundaries,
split by who wrote it, as the terminal colours it."""

from __future__ import annotations

from specgguf.core.engine import StepEvent
from specgguf.serve.draft_marks import DraftMarks, Span
from specgguf.serve.text import AnswerText

# "é" is split across tokens 5 (an n-gram draft) and 6 (the verifier's): the token that completes it wrote it.
PIECES = {1: b"He", 2: b"llo", 3: b" w", 4: b"orld", 5: "é".encode()[:1], 6: "é".encode()[1:], 7: b"!"}


def _event(accepted, verifier_token, source="model", rejected=()):
    return StepEvent(
        accepted=accepted,
        rejected=list(rejected),
        verifier_token=verifier_token,
        n_drafted=len(accepted) + len(rejected),
        n_accepted=len(accepted),
        draft_seconds=0.0,
        verify_seconds=0.0,
        sample_seconds=0.0,
        draft_source=source,
    )


EVENTS = [
    _event([1, 2], 3, rejected=[7]),  # "He" "llo" accepted, " w" the verifier's replacement
    _event([4, 5], None, source="ngram"),  # the generation ended after accepted drafts
    _event([], 6),  # a step that drafted nothing
    _event([7], None, source="grammar"),
]


def _marked(stops: list[str]) -> list[tuple[str, list[Span]]]:
    """Each delta the answer hands out (stop strings held back) with its spans."""
    answer, marks = AnswerText(PIECES.__getitem__, stops), DraftMarks(PIECES.__getitem__)
    deltas = [(text, marks.step(event, text)) for event in EVENTS for text in [answer.add(event.tokens)]]
    tail = answer.finish()
    return [*deltas, (tail, marks.spans(tail))]


def _writers(deltas) -> str:
    """One letter per character: m(odel), n(gram), g(rammar), v(erifier)."""
    return "".join(span.source[0] * len(span.text) for _, spans in deltas for span in spans)


def test_spans_follow_the_tokens_that_wrote_each_character():
    deltas = _marked([])
    assert "".join(text for text, _ in deltas) == "Hello worldé!"
    assert all("".join(span.text for span in spans) == text for text, spans in deltas)
    assert _writers(deltas) == "mmmmm" + "vv" + "nnnn" + "v" + "g"
    assert deltas[0][1] == [Span("Hello", "model"), Span(" w", "verifier")]  # runs of one writer


def test_spans_split_text_held_back_for_a_stop_string_and_released_later():
    deltas = _marked(["d!?", "é!?"])  # "d" then "é" are held back until the next token rules them out
    texts = [text for text, _ in deltas]
    assert texts == ["Hello w", "orl", "d", "", "é!"]  # "é!" waits for the end: it could still be "é!?"
    assert all("".join(span.text for span in spans) == text for text, spans in deltas)
    assert _writers(deltas) == "mmmmm" + "vv" + "nnnn" + "v" + "g"  # the same marks, whatever the cuts


def test_a_stop_string_cuts_the_marks_with_the_text():
    deltas = _marked(["ld"])
    assert [text for text, _ in deltas] == ["Hello w", "or", "", "", ""]
    assert _writers(deltas) == "mmmmm" + "vv" + "nn"
