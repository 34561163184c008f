"""Step events -> text on screen. Reads the events' flags; never recomputes acceptance.

On a terminal, accepted draft tokens, the verifier's own tokens and (on request)
rejected drafts are styled differently; model text always goes through
`rich.text.Text`, never markup. Piped, it is plain text, flushed per step.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..core.engine import StepEvent
from ..core.events import Generation, GenerationStats

STYLE_ACCEPTED = {"model": "green", "ngram": "cyan"}  # by drafter
STYLE_VERIFIER = ""
STYLE_REJECTED = "red strike dim"


def legend() -> Text:
    return Text.assemble(
        "colours: ",
        ("accepted draft", STYLE_ACCEPTED["model"]),
        " · ",
        ("accepted n-gram", STYLE_ACCEPTED["ngram"]),
        " · ",
        ("verifier", STYLE_VERIFIER),
        " · ",
        ("rejected draft", STYLE_REJECTED),
    )


class TokenStream:
    """Writes each event's tokens as they come; keeps the whole text for --json and chat history."""

    def __init__(
        self,
        token_bytes: Callable[[int], bytes],
        *,
        console: Console | None,
        out: TextIO | None,
        show_rejected: bool = False,
    ):
        self._token_bytes = token_bytes
        self._console = console  # None: plain text to `out`
        self._out = out  # None too: only collect the text (for --json)
        self._show_rejected = show_rejected
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _decode(self, token: int) -> str:
        # One decoder for the whole stream: a character split across tokens
        # appears with the token that completes it.
        return self._decoder.decode(self._token_bytes(token))

    def write(self, event: StepEvent) -> str:
        accepted_style = STYLE_ACCEPTED.get(event.draft_source or "model", "green")
        segments = [(self._decode(token), accepted_style) for token in event.accepted]
        if event.rejected and self._show_rejected and self._console is not None:
            rejected = b"".join(self._token_bytes(token) for token in event.rejected)
            segments.append((rejected.decode("utf-8", errors="replace"), STYLE_REJECTED))
        if event.verifier_token is not None:
            segments.append((self._decode(event.verifier_token), STYLE_VERIFIER))
        new_text = "".join(text for text, style in segments if style != STYLE_REJECTED)
        self.parts.append(new_text)
        if self._console is not None:
            self._console.print(Text.assemble(*segments), end="", soft_wrap=True)
        elif new_text and self._out is not None:
            self._out.write(new_text)
            self._out.flush()
        return new_text

    def write_all(self, generation: Generation) -> GenerationStats:
        """Write a whole answer as it comes, then finish the stream; its stats."""
        for event in generation:
            self.write(event)
        self.finish()
        return generation.stats

    def finish(self) -> None:
        tail = self._decoder.decode(b"", final=True)
        self.parts.append(tail)
        if self._console is not None:
            self._console.print(Text(tail), soft_wrap=True)
        elif self._out is not None:
            self._out.write(tail + "\n")
            self._out.flush()
