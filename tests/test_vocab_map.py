"""core/vocab_map.py: token texts of both forms normalised to bytes, control tokens matched only as
control tokens, the map's shares and its checks; and cross_drafter's whole-character cut."""

from __future__ import annotations

import numpy as np
import pytest

from specgguf.core.cross_drafter import complete_utf8
from specgguf.core.vocab_map import (
    BPE,
    BYTE,
    CONTROL,
    NORMAL,
    SPM,
    UNUSED,
    USER,
    VocabMap,
    VocabMapError,
    VocabPieces,
    build_vocab_map,
    check_map,
    token_kind,
    token_piece,
)


@pytest.mark.parametrize(
    "text, kind, vocab_type, piece",
    [
        ("Ġhello", NORMAL, BPE, b" hello"),
        ("ĊĊ", NORMAL, BPE, b"\n\n"),
        ("Ã©", NORMAL, BPE, "é".encode()),  # two byte characters, one UTF-8 character
        ("â", NORMAL, BPE, bytes([0xE2])),  # a lone lead byte: half a character
        ("▁hello", NORMAL, SPM, b" hello"),
        ("é", NORMAL, SPM, "é".encode()),
        ("<0x0A>", BYTE, SPM, b"\n"),
        ("<0xE2>", BYTE, SPM, bytes([0xE2])),
        ("<|im_end|>", CONTROL, BPE, b"<|im_end|>"),
        ("<tool_call>", USER, BPE, b"<tool_call>"),  # user-defined: as written, not byte-decoded
    ],
)
def test_token_texts_become_the_bytes_they_stand_for(text, kind, vocab_type, piece):
    assert token_piece(text, kind, vocab_type) == piece


def test_two_forms_of_the_same_text_map_to_each_other():
    draft = VocabPieces.from_texts(
        ["<s>", "Ġhello", "hello", "<|im_end|>", "<|im_end|>", "Ċ", "<unused0>", "Ġworld"],
        [CONTROL, NORMAL, NORMAL, CONTROL, NORMAL, NORMAL, UNUSED, NORMAL],
        BPE,
    )
    verifier = VocabPieces.from_texts(
        ["<s>", "<0x0A>", "▁hello", "hello", "<|im_end|>", "\n", "<unused0>", "▁there"],
        [CONTROL, BYTE, NORMAL, NORMAL, CONTROL, NORMAL, UNUSED, NORMAL],
        SPM,
    )
    vocab_map = build_vocab_map(draft, verifier)
    # <s> by its role and text; " hello" and "hello" by bytes; the control <|im_end|> only to the
    # control one, the draft's plain-text "<|im_end|>" to nothing; "\n" to the verifier's text token,
    # not its byte token; unused and unshared tokens to nothing.
    assert vocab_map.to_verifier.tolist() == [0, 2, 3, 4, -1, 5, -1, -1]
    assert vocab_map.verifier_covered.tolist() == [True, False, True, True, True, True, False, False]
    assert vocab_map.overlap == pytest.approx(5 / 8)
    written = np.array([0, 0, 6, 1, 1, 2, 0, 10])  # the verifier's answers: 10 of 20 are " there"
    assert vocab_map.answer_share(written) == pytest.approx(10 / 20)


@pytest.mark.parametrize(
    "to_verifier, reason",
    [
        (np.array([0, 1, -1], dtype=np.int64), "int32"),
        (np.array([0, 1], dtype=np.int32), "shape"),
        (np.array([0, 1, 4], dtype=np.int32), "outside"),
        (np.array([0, -2, 1], dtype=np.int32), "outside"),
    ],
)
def test_a_damaged_map_is_refused(to_verifier, reason):
    with pytest.raises(VocabMapError, match=reason):
        check_map(to_verifier, n_draft=3, n_verifier=4)
    if len(to_verifier) == 3:  # a map is checked when it is made
        with pytest.raises(VocabMapError):
            VocabMap(to_verifier, 4)


@pytest.mark.parametrize(
    "text, whole",
    [(b"abc", 3), ("é".encode(), 2), ("é".encode()[:1], 0), ("a€".encode()[:3], 1), ("a😀".encode(), 5), (b"", 0)],
)
def test_only_whole_characters_are_read(text, whole):
    assert complete_utf8(text) == whole


def test_llamas_attribute_bits_become_one_kind():
    assert [token_kind(bits) for bits in (4, 8, 16, 32, 2, 1, 0, 4 | 128, 8 | 256)] == [
        NORMAL, CONTROL, USER, BYTE, UNUSED, UNUSED, UNUSED, NORMAL, CONTROL
    ]  # fmt: skip
