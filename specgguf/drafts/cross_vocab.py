"""Cross-vocabulary pairs: the vocabulary map (core/vocab_map.py) built from the two models' token
texts, kept in the cache folder (files/vocab_maps.py) and checked when read back (a damaged or
mismatched file is rebuilt, with a warning), and the drafter over it (core/cross_drafter.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core.cross_drafter import DEFAULT_CROSS_MODE, CrossMode, CrossVocab, VerifierText
from ..core.vocab_map import VocabMap, VocabMapError, VocabPieces, build_vocab_map, check_map
from ..errors import AssetError
from ..files.derived import counts_path
from ..files.small_files import read_npy
from ..files.vocab_maps import read_array, vocab_map_path, write_array
from ..llama.compat import VocabInfo
from ..llama.loaded import LoadedModel


def vocab_pieces(info: VocabInfo) -> VocabPieces:
    texts = [text.decode("utf-8", "replace") if isinstance(text, bytes) else text for text in info.token_texts]
    return VocabPieces.from_texts(texts, info.token_attrs, info.vocab_type)


def pair_map(draft: VocabInfo, verifier: VocabInfo, *, draft_path: Path, verifier_path: Path) -> VocabMap:
    """The pair's map: the stored one if it fits the pair, else built (about a second) and stored."""
    path = vocab_map_path(draft_path, verifier_path)
    try:
        stored = read_array(path, length=draft.n_vocab)
        if stored is not None:
            check_map(stored, n_draft=draft.n_vocab, n_verifier=verifier.n_vocab)
            return VocabMap(stored, verifier.n_vocab)
    except (ValueError, VocabMapError) as error:
        sys.stderr.write(f"specgguf: warning: {path}: a damaged vocabulary map ({error}); building it again\n")
    vocab_map = build_vocab_map(vocab_pieces(draft), vocab_pieces(verifier))
    try:
        write_array(path, vocab_map.to_verifier)
    except AssetError as error:  # not kept: built again next time
        sys.stderr.write(f"specgguf: warning: {error}\n")
    return vocab_map


def shared_text(vocab_map: VocabMap, verifier_path: Path) -> str:
    """The overlap in words: of the verifier's vocabulary, and of its own answers where they were
    counted here (files/derived.py's `counts_path`, the hot vocabulary's calibration; never counted for this)."""
    text = f"{vocab_map.overlap:.0%} of the verifier's tokens shared"
    try:
        written = read_npy(counts_path(verifier_path), dtype=np.int64, length=vocab_map.n_verifier)
    except (OSError, ValueError):
        return text  # not counted here (or damaged: drafts/made.py counts again when it needs them)
    if written.min() >= 0:
        text += f", {vocab_map.answer_share(written):.0%} of its answers"
    return text


def _read_pieces(pieces: VocabPieces, bos: int) -> Sequence[bytes]:
    """What the draft reads for each verifier token: its bytes, a control token's text (a chat marker
    the draft may know as its own), nothing for the BOS (the draft puts its own first)."""
    read = list(pieces.pieces)
    if 0 <= bos < len(read):
        read[bos] = b""
    return read


def cross_vocab(draft: LoadedModel, verifier: LoadedModel, mode: CrossMode = DEFAULT_CROSS_MODE) -> CrossVocab:
    """What the cross-vocabulary drafter needs for a loaded pair, over the pair's (cached) map; in
    `mode` "string" it re-encodes the draft's text with the verifier's tokenizer (core/string_drafter.py)."""
    draft_info, verifier_info = draft.vocab_info(), verifier.vocab_info()
    vocab_map = pair_map(draft_info, verifier_info, draft_path=draft.path, verifier_path=verifier.path)
    verifier_pieces = _read_pieces(vocab_pieces(verifier_info), verifier_info.bos)
    return CrossVocab(
        vocab_map,
        verifier_pieces=verifier_pieces,
        draft_pieces=vocab_pieces(draft_info).pieces,
        tokenize=draft.text_tokenizer(),
        bos=draft_info.bos if draft_info.add_bos else None,
        mode=mode,
        verifier_text=VerifierText(verifier.text_tokenizer(), verifier_pieces),
    )
