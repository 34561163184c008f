"""Who wrote each piece of a streamed answer: an accepted draft (by its drafter) or the verifier.

A stream that asks for it (`"speculative": {"mark_drafts": true}`, what the page at `/` sends) gets
each chunk's text split into `Span`s, so a browser can colour accepted drafts as the terminal does.
The marks read the step events' own lists (`accepted`, `verifier_token`, `draft_source`) and never
recompute acceptance. The text handed out is cut at stop strings and held back in between
(text.AnswerText), so it does not follow step boundaries: `DraftMarks` keeps each token's byte range
and splits whatever text comes next by the token that completes each character (as the terminal's
decoder shows a character split across tokens with the token that completes it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..core.drafting import Source
from ..core.engine import StepEvent

Writer = Source | Literal["verifier"]


@dataclass(frozen=True)
class Span:
    text: str
    source: Writer  # "model", "ngram" or "grammar" (forced tokens): an accepted draft; else "verifier"


class DraftMarks:
    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._ends: list[int] = []  # byte offset where each token of the answer ends
        self._writers: list[Writer] = []
        self._marked = 0  # bytes of the answer split into spans so far
        self._token = 0  # the token that holds the next byte

    def add(self, event: StepEvent) -> None:
        """One step's tokens, in output order: accepted drafts, then the verifier's token."""
        source: Source = event.draft_source or "model"
        for token in event.accepted:
            self._push(token, source)
        if event.verifier_token is not None:
            self._push(event.verifier_token, "verifier")

    def step(self, event: StepEvent, text: str) -> list[Span]:
        """`add` the step's tokens, then split the text they released (maybe empty)."""
        self.add(event)
        return self.spans(text)

    def _push(self, token: int, writer: Writer) -> None:
        self._ends.append((self._ends[-1] if self._ends else 0) + len(self._token_bytes(token)))
        self._writers.append(writer)

    def spans(self, text: str) -> list[Span]:
        """The next text handed out (it follows the last), as runs of one writer each.

        A character the decoder replaced (U+FFFD for bytes that are not UTF-8) counts as its
        replacement's three bytes: the marks drift at most to the last token, never past it."""
        runs: list[tuple[list[str], Writer]] = []
        for char in text:
            self._marked += len(char.encode("utf-8", errors="replace"))
            while self._token < len(self._ends) - 1 and self._ends[self._token] < self._marked:
                self._token += 1
            writer: Writer = self._writers[self._token] if self._writers else "verifier"
            if runs and runs[-1][1] == writer:
                runs[-1][0].append(char)
            else:
                runs.append(([char], writer))
        return [Span("".join(chars), writer) for chars, writer in runs]
