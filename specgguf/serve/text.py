"""Generated tokens -> the text a client may see, cut exactly at a stop string.

One verify pass can emit a burst of accepted drafts; a stop string may end in the
middle of it, or start in one burst and end in the next. `AnswerText` decodes the
tokens as they come and hands out only text that cannot be the start of a stop
string: what might be is held back until the next tokens settle it. When a stop
string appears, the answer ends right before it and nothing after it is ever
handed out.
"""

from __future__ import annotations

import codecs
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability under the verifier, and the most likely alternatives."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]


def token_logprobs(
    rows: np.ndarray, tokens: list[int], *, n_top: int, token_bytes: Callable[[int], bytes]
) -> list[TokenLogprob]:
    """Log-softmax of the verifier's raw logits (no temperature, top-k/top-p/min-p) at each token."""
    result = []
    for row, token in zip(rows, tokens):
        row = row.astype(np.float64)
        shifted = row - row.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        best = np.argpartition(-logprobs, n_top - 1)[:n_top] if n_top else np.array([], dtype=np.int64)
        best = best[np.argsort(-logprobs[best], kind="stable")]
        result.append(
            TokenLogprob(
                token_bytes(token),
                float(logprobs[token]),
                [(token_bytes(int(other)), float(logprobs[other])) for other in best],
            )
        )
    return result


def time_cut(
    tokens: list[int], token_bytes: Callable[[int], bytes], *, elapsed_ms: float, limit_ms: int
) -> tuple[list[int], bool]:
    """llama-server's `t_max_predict_ms`, token by token: past the limit, the first token whose text
    holds a new line is the answer's last ("length"). A step's tokens up to it, and whether it came."""
    if elapsed_ms <= limit_ms:
        return tokens, False
    ends = [i for i, token in enumerate(tokens) if ends_line(token, token_bytes)]
    return (tokens[: ends[0] + 1], True) if ends else (tokens, False)


def ends_line(token: int, token_bytes: Callable[[int], bytes]) -> bool:
    """Whether `time_cut` ends an answer past its limit with this token: its text holds a new line."""
    return b"\n" in token_bytes(token)


class AnswerText:
    def __init__(self, token_bytes: Callable[[int], bytes], stops: list[str], *, n_indent: int = 0):
        self._token_bytes = token_bytes
        self.n_indent = n_indent  # FIM: a later line indented less than this ends the answer before it
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = stops
        self.text = ""  # decoded so far; after a stop string, only the part before it
        self.sent = 0  # characters of `text` handed out
        self.sent_bytes = 0  # ... and their length in UTF-8
        self.stopped = False  # a stop string was found
        self.matched: str | None = None  # ... which one (None: the indentation rule, or none)
        self.tokens: list[int] = []
        self._ends: list[int] = []  # byte offset where each token ends

    def add(self, tokens: list[int]) -> str:
        """Take one step's tokens; return the newly safe text (maybe empty)."""
        if self.stopped:
            return ""
        for token in tokens:
            data = self._token_bytes(token)
            self.tokens.append(token)
            self._ends.append((self._ends[-1] if self._ends else 0) + len(data))
            self.text += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """The generation ended: hand out what was held back (an incomplete character too)."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if self.stopped:
            return ""
        longest = max((len(stop) for stop in self.stops), default=0)
        search_from = max(0, self.sent - longest + 1)
        found = [at for at in (self.text.find(stop, search_from) for stop in self.stops) if at >= 0]
        hits = {self.text.find(stop, search_from): stop for stop in reversed(self.stops)}
        self.matched = hits.get(min(found)) if found else None  # the stop string that ended it
        if self.n_indent and (cut := self._indent_cut()) is not None:
            found.append(cut)
        if found:
            self.stopped = True
            self.text = self.text[: min(found)]
            end = len(self.text)
        else:
            end = len(self.text) if final else len(self.text) - self._held_back()
        delta = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        self.sent_bytes += len(delta.encode("utf-8"))
        return delta

    def _indent_cut(self) -> int | None:
        """llama-server's n_indent rule: after the first new line, a line whose first non-blank
        character comes at less than `n_indent` spaces/tabs ends the answer right there."""
        at = self.text.find("\n")
        while at >= 0:
            start = end = at + 1
            while end < len(self.text) and self.text[end] in " \t":
                end += 1
            if end < len(self.text) and end - start < self.n_indent:
                return end
            at = self.text.find("\n", start)
        return None

    def n_tokens_shown(self) -> int:
        """Tokens whose text has started to be handed out (a token cut by a stop string counts)."""
        if self.sent_bytes == 0:
            return 0
        return min(len(self.tokens), bisect_left(self._ends, self.sent_bytes) + 1)

    def _held_back(self) -> int:
        """Length of the longest end of `text` that a stop string starts with."""
        for size in range(min(len(self.text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            tail = self.text[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0

    def n_tokens_used(self, stop_string_found: bool) -> int:
        """Tokens the answer took: all of them, or (after a stop string) those up to the one it starts in."""
        if not stop_string_found:
            return len(self.tokens)
        stop_end = len(self.text.encode("utf-8")) + 1
        return min(len(self.tokens), bisect_left(self._ends, stop_end) + 1)
