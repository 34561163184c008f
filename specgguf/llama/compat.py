"""Can this draft be paired with this verifier? llama.cpp's rules, with reasons.

The rules are those of llama.cpp's `common_speculative_are_compatible`
(common/speculative.cpp): same vocabulary type, same BOS/EOS ids and add-BOS/EOS
flags, vocabulary sizes within 128, and identical token text from id 5 on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import IncompatibleModelsError

MAX_VOCAB_SIZE_DIFFERENCE = 128
CHECK_START_TOKEN_ID = 5
VOCAB_TYPES = {0: "none", 1: "SPM (llama)", 2: "BPE (gpt2)", 3: "WPM (bert)", 4: "UGM (t5)", 5: "RWKV", 6: "PLaMo-2"}


@dataclass(frozen=True)
class VocabInfo:
    """What the check reads from one model's vocabulary."""

    name: str
    vocab_type: int
    n_vocab: int
    add_bos: bool
    add_eos: bool
    bos: int
    eos: int
    token_texts: tuple[bytes, ...]  # by token id; read eagerly, so it outlives the model
    token_attrs: tuple[int, ...] = ()  # by token id: llama.cpp's attribute bits (control, byte, ...)


@dataclass(frozen=True)
class Finding:
    item: str
    ok: bool
    detail: str


def compare_vocabularies(verifier: VocabInfo, draft: VocabInfo, *, max_examples: int = 3) -> list[Finding]:
    """Every rule, passed or failed, with what was seen."""
    findings = [
        Finding(
            "tokenizer type",
            verifier.vocab_type == draft.vocab_type,
            f"verifier {VOCAB_TYPES.get(verifier.vocab_type, verifier.vocab_type)},"
            f" draft {VOCAB_TYPES.get(draft.vocab_type, draft.vocab_type)}",
        )
    ]
    specials = [
        (label, getattr(verifier, attr), getattr(draft, attr))
        for label, attr in (("BOS id", "bos"), ("EOS id", "eos"), ("adds BOS", "add_bos"), ("adds EOS", "add_eos"))
    ]
    differing = [f"{label}: verifier {ours}, draft {theirs}" for label, ours, theirs in specials if ours != theirs]
    findings.append(
        Finding("special tokens", not differing, "; ".join(differing) or "BOS, EOS and their add flags agree")
    )
    size_gap = abs(verifier.n_vocab - draft.n_vocab)
    findings.append(
        Finding(
            "vocabulary size",
            size_gap <= MAX_VOCAB_SIZE_DIFFERENCE,
            f"verifier {verifier.n_vocab}, draft {draft.n_vocab} (differ by {size_gap};"
            f" at most {MAX_VOCAB_SIZE_DIFFERENCE} allowed)",
        )
    )
    examples: list[str] = []
    n_differing = 0
    if findings[0].ok:
        for token in range(CHECK_START_TOKEN_ID, min(verifier.n_vocab, draft.n_vocab)):
            ours, theirs = verifier.token_texts[token], draft.token_texts[token]
            if ours != theirs:
                n_differing += 1
                if len(examples) < max_examples:
                    examples.append(
                        f"token {token}: verifier {ours.decode('utf-8', 'replace')!r},"
                        f" draft {theirs.decode('utf-8', 'replace')!r}"
                    )
        findings.append(
            Finding(
                "token texts",
                n_differing == 0,
                f"all {min(verifier.n_vocab, draft.n_vocab) - CHECK_START_TOKEN_ID} shared tokens from id"
                f" {CHECK_START_TOKEN_ID} agree"
                if n_differing == 0
                else f"{n_differing} tokens differ, e.g. " + "; ".join(examples),
            )
        )
    return findings


def vocabularies_match(verifier: VocabInfo, draft: VocabInfo) -> bool:
    """The pair shares one vocabulary (else it drafts only through text: drafts/cross_vocab.py)."""
    return all(finding.ok for finding in compare_vocabularies(verifier, draft, max_examples=0))


def ensure_compatible(verifier: VocabInfo, draft: VocabInfo) -> None:
    """Raise IncompatibleModelsError naming the first rule the pair breaks."""
    for finding in compare_vocabularies(verifier, draft, max_examples=1):
        if not finding.ok:
            raise IncompatibleModelsError(
                f"draft {draft.name} cannot be paired with verifier {verifier.name}:"
                f" {finding.item} differ ({finding.detail})"
            )
