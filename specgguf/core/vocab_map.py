"""The vocabulary map of a cross-vocabulary pair: which draft token ids have a verifier token with the
same text, compared as bytes (Timor et al., ICML 2025, arXiv 2502.05202: "Token-Level Intersection").

A vocabulary's token texts come in two forms, normalised to bytes here (`token_pieces`):
- byte-level BPE (GPT-2 style, llama.cpp's vocabulary type 2): each byte is written as one printable
  character (`Ġ` is the space byte, `Ċ` the newline), GPT-2's `bytes_to_unicode` table;
- SentencePiece (type 1): `▁` is a space, a byte-fallback token `<0xNN>` is the byte NN, the rest UTF-8.
A user-defined token's text is its bytes as written, in either form. Control tokens (BOS, EOS, chat
markers) are not text: one maps only to a verifier control token with the identical text, never to a
text token that happens to spell it; unused tokens map to nothing.

Where a verifier has two tokens with the same bytes (SentencePiece's `A` and `<0x41>`), a draft token
maps to the text token, the one the verifier's tokenizer writes. Which one is chosen does not matter
for exactness (the drafter's q is reported over verifier ids, whatever it is: cross_drafter.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

# A token's kind: llama.cpp's token attribute bits (llama_token_attr) that say what its text is.
UNUSED, NORMAL, CONTROL, USER, BYTE = 2, 4, 8, 16, 32


def token_kind(attributes: int) -> int:
    """A token's llama.cpp attributes (llama/compat.py's `VocabInfo.token_attrs`) as one kind; unknown or
    undefined tokens are UNUSED: never proposed, never matched."""
    for kind in (CONTROL, USER, BYTE, NORMAL):
        if attributes & kind:
            return kind
    return UNUSED


BPE, SPM = 2, 1  # llama.cpp's vocabulary types with a byte form known here


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shift)
            shift += 1
    return table


BYTE_DECODER = {char: byte for byte, char in _bytes_to_unicode().items()}


def token_piece(text: str, kind: int, vocab_type: int) -> bytes:
    """One token's text as the bytes it stands for (a control token: its text, matched only by kind)."""
    if kind == BYTE and text.startswith("<0x") and text.endswith(">") and len(text) == 6:
        return bytes([int(text[3:5], 16)])
    if kind == NORMAL and vocab_type == BPE and all(char in BYTE_DECODER for char in text):
        return bytes(BYTE_DECODER[char] for char in text)
    if kind == NORMAL and vocab_type == SPM:
        return text.replace("▁", " ").encode()
    return text.encode()


@dataclass(frozen=True)
class VocabPieces:
    """A vocabulary as bytes: each token's piece and kind (NORMAL, BYTE, CONTROL, USER, UNUSED)."""

    pieces: tuple[bytes, ...]
    kinds: tuple[int, ...]

    @classmethod
    def from_texts(cls, texts: Sequence[str], attributes: Sequence[int], vocab_type: int) -> VocabPieces:
        """From token texts and their llama.cpp attributes (a kind is one such attribute)."""
        kinds = tuple(token_kind(attribute) for attribute in attributes)
        pieces = tuple(token_piece(text, kind, vocab_type) for text, kind in zip(texts, kinds, strict=True))
        return cls(pieces, kinds)

    def key(self, token: int) -> tuple[bool, bytes] | None:
        """What must match for two tokens to be one: the bytes, and whether it is a control token."""
        kind = self.kinds[token]
        if kind == UNUSED or not self.pieces[token]:
            return None
        return (kind == CONTROL, self.pieces[token])


class VocabMapError(ValueError):
    """A stored map that does not fit its pair (drafts/cross_vocab.py rebuilds it)."""


@dataclass(frozen=True)
class VocabMap:
    """draft id -> verifier id with the same bytes (-1: none), for a verifier of `n_verifier` tokens."""

    to_verifier: np.ndarray  # int32, one entry per draft token
    n_verifier: int

    def __post_init__(self) -> None:
        check_map(self.to_verifier, n_draft=len(self.to_verifier), n_verifier=self.n_verifier)

    @cached_property  # read at every draft
    def shared(self) -> np.ndarray:
        """The draft ids it may propose (bool per draft id)."""
        return self.to_verifier >= 0

    @property
    def verifier_covered(self) -> np.ndarray:
        """The verifier ids some draft token maps to (bool per verifier id)."""
        covered = np.zeros(self.n_verifier, dtype=bool)
        covered[self.to_verifier[self.shared]] = True
        return covered

    @property
    def overlap(self) -> float:
        """The share of the verifier's vocabulary the draft can propose."""
        return float(self.verifier_covered.mean()) if self.n_verifier else 0.0

    def answer_share(self, written: np.ndarray) -> float:
        """The share of the verifier's own answers it covers, from counts of the tokens it wrote
        (files/derived.py's `counts_path`: the hot vocabulary's calibration counts)."""
        total = float(written.sum())
        return float(written[: self.n_verifier][self.verifier_covered[: len(written)]].sum()) / total if total else 0.0


def check_map(to_verifier: np.ndarray, *, n_draft: int, n_verifier: int) -> None:
    """VocabMapError unless it is a map of this pair: int32, one entry per draft id, each -1 or a verifier id."""
    if not isinstance(to_verifier, np.ndarray) or to_verifier.dtype != np.int32 or to_verifier.shape != (n_draft,):
        shape = getattr(to_verifier, "shape", None)
        raise VocabMapError(f"expected int32 of shape ({n_draft},), got {getattr(to_verifier, 'dtype', None)} {shape}")
    if n_draft and (to_verifier.min() < -1 or to_verifier.max() >= n_verifier):
        raise VocabMapError(f"ids outside -1..{n_verifier - 1}")


def build_vocab_map(draft: VocabPieces, verifier: VocabPieces) -> VocabMap:
    """Map every draft token to the verifier token with the same key (bytes and control-ness)."""
    by_key: dict[tuple[bool, bytes], int] = {}
    # Text tokens first, byte-fallback tokens last: a key both have goes to the text token.
    for token in sorted(range(len(verifier.kinds)), key=lambda token: (verifier.kinds[token] == BYTE, token)):
        key = verifier.key(token)
        if key is not None:
            by_key.setdefault(key, token)
    to_verifier = np.full(len(draft.kinds), -1, dtype=np.int32)
    for token in range(len(draft.kinds)):
        key = draft.key(token)
        if key is not None:
            to_verifier[token] = by_key.get(key, -1)
    return VocabMap(to_verifier, len(verifier.kinds))
