"""The string-level drafter's text round trip (core/string_drafter.py) on small scripted vocabularies:
a SentencePiece draft (`▁` spaces, `<0xNN>` byte fallback) for a GPT-2-style verifier (`Ġ` spaces),
UTF-8 characters split across draft tokens and across the verifier's context, a verifier tokenizer that
writes a space before the text, and what is held back at the end."""

from __future__ import annotations

import numpy as np

from fakes import FakeModel, TextVocab
from specgguf.core.cross_drafter import CrossVocab, VerifierText
from specgguf.core.drafting import DraftStep
from specgguf.core.sampling import SamplingSettings
from specgguf.core.string_drafter import StringDrafter, reencode
from specgguf.core.vocab_map import BPE, BYTE, NORMAL, SPM, VocabPieces, build_vocab_map

ZHONG = "中".encode()  # e4 b8 ad
DRAFT = VocabPieces.from_texts(
    ["<0xE4>", "<0xB8>", "<0xAD>", "▁x", "x", "y", "▁"], [BYTE, BYTE, BYTE, NORMAL, NORMAL, NORMAL, NORMAL], SPM
)
VERIFIER = VocabPieces.from_texts(["x", "Ġx", "ä¸Ń", "Ġ", "y", "xy", "xyy"], [NORMAL] * 7, BPE)


def test_both_vocabularies_are_read_as_bytes():
    assert DRAFT.pieces[:4] == (b"\xe4", b"\xb8", b"\xad", b" x")
    assert VERIFIER.pieces[:3] == (b"x", b" x", ZHONG)


def _drafter(script: dict[int, int], verifier: VerifierText | None = None, **options) -> StringDrafter:
    """A draft that writes `script[last token]` after its last token (greedy), for VERIFIER."""

    def logits(context):
        row = np.zeros(len(DRAFT.pieces))
        row[script.get(context[-1], 4)] = 10.0
        return row

    verifier = verifier or VerifierText(TextVocab(VERIFIER.pieces).tokenize, VERIFIER.pieces)
    cross = CrossVocab(
        build_vocab_map(DRAFT, VERIFIER), VERIFIER.pieces, DRAFT.pieces, TextVocab(DRAFT.pieces).tokenize
    )
    return StringDrafter(FakeModel(logits, n_vocab=len(DRAFT.pieces)), cross, verifier, **options)


def _propose(drafter, context, k=4):
    step = DraftStep(
        n_vocab=len(VERIFIER.pieces), settings=SamplingSettings(temperature=0.0), rng=np.random.default_rng()
    )
    return drafter.propose(list(context), k, step).tokens


def test_a_spm_space_is_the_verifiers_g_space():
    # x, then the draft's `▁x` three times: the verifier's `Ġx` each time (none can grow: held back never).
    assert _propose(_drafter({4: 3, 3: 3}), [0]) == [1, 1, 1, 1]


def test_byte_fallback_tokens_make_one_whole_character():
    """The draft writes 中 as three byte tokens; the verifier has it whole. Two bytes are not yet a
    character: nothing of them is proposed until the third comes."""
    script = {4: 0, 0: 1, 1: 2, 2: 4}  # x -> e4 -> b8 -> ad -> x
    assert _propose(_drafter(script), [0], k=2) == []
    assert _propose(_drafter(script), [0], k=3) == [2]


def test_a_character_the_context_began_is_finished_not_repeated():
    """The verifier's context ends in the first byte of 中 (a verifier of byte tokens for it): the draft
    read up to the whole characters, so it writes e4 b8 ad; the proposal is b8 ad only."""
    verifier = VocabPieces.from_texts(["x", "<0xE4>", "<0xB8>", "<0xAD>", "y"], [NORMAL, BYTE, BYTE, BYTE, NORMAL], SPM)
    cross = CrossVocab(
        build_vocab_map(DRAFT, verifier), verifier.pieces, DRAFT.pieces, TextVocab(DRAFT.pieces).tokenize
    )

    def logits(context):
        row = np.zeros(len(DRAFT.pieces))
        row[{4: 0, 0: 1, 1: 2, 2: 5}.get(context[-1], 5)] = 10.0
        return row

    text = VerifierText(TextVocab(verifier.pieces).tokenize, verifier.pieces)
    drafter = StringDrafter(FakeModel(logits, n_vocab=len(DRAFT.pieces)), cross, text)
    step = DraftStep(n_vocab=5, settings=SamplingSettings(temperature=0.0), rng=np.random.default_rng())
    assert drafter.propose([0, 1], 4, step).tokens == [2, 3, 4]  # b8 ad y (y held back: nothing grows it)


def test_the_last_token_waits_when_a_longer_one_starts_with_it():
    # After `x`, the draft's `yyyy` re-encodes as `xyy`,`y`,`y`: the window's `x` merges, nothing.
    assert _propose(_drafter({4: 5, 5: 5}), [0]) == []
    # After ` x`: `y y y` -> `y`,`y`,`y`; each `y` could not grow (no `yy`): all four kept.
    assert _propose(_drafter({3: 5, 5: 5}), [1]) == [4, 4, 4, 4]
    # `always` holds the last one back whatever follows.
    assert _propose(_drafter({3: 5, 5: 5}, hold="always"), [1]) == [4, 4, 4]
    # The draft writes ` x` after ` x`: `Ġx` could grow? No longer token starts with ` x`: kept.
    assert _propose(_drafter({3: 3}), [1], k=1) == [1]
    # After `y`, the draft's `x` alone could grow into `xy`: held back.
    assert _propose(_drafter({5: 4}), [4], k=1) == []


def test_a_tokenizer_that_writes_a_space_before_the_text():
    """SentencePiece's space prefix: the window's own first space is left for the tokenizer to write;
    a window that starts with no space drafts nothing; with no window the text would gain a space."""
    plain = TextVocab(VERIFIER.pieces).tokenize
    spaced = VerifierText(lambda data: plain(b" " + data), VERIFIER.pieces)
    assert spaced.adds_space and not VerifierText(plain, VERIFIER.pieces).adds_space
    assert reencode(spaced, [1], b" x", window=1) == ([1], [1])
    assert reencode(spaced, [0], b" x", window=1) is None  # `x` would come back as ` x`
    assert reencode(spaced, [], b"x", window=1) is None  # no window: ` x` is not the text `x`
    assert _propose(_drafter({3: 3}, verifier=spaced), [1], k=2) == [1, 1]


def test_only_the_window_is_re_encoded():
    seen: list[bytes] = []
    plain = TextVocab(VERIFIER.pieces).tokenize

    def tokenize(data):
        seen.append(data)
        return plain(data)

    drafter = _drafter({3: 3}, verifier=VerifierText(tokenize, VERIFIER.pieces), context_window=2)
    assert _propose(drafter, [1] * 50, k=2) == [1, 1]
    assert seen[-1] == b" x" * 4  # two of the context's tokens, then the two new ones


def test_the_unread_part_of_the_context_is_counted_in_verifier_tokens():
    """What the engine's reading rule (core/drafting.py) defers: the context's tokens whose text the draft
    has not read, all but the newest (its first draft row reads that)."""
    drafter = _drafter({4: 3, 3: 3})
    assert drafter.unread([0, 1, 1, 1]) == 3
    _propose(drafter, [0, 1, 1, 1])
    assert drafter.unread([0, 1, 1, 1]) == 0 and drafter.unread([0, 1, 1, 1, 1, 1]) == 1  # two new: one unread
    assert drafter.unread([0, 4, 1, 1]) == 2  # changed after the first token: read again from there
