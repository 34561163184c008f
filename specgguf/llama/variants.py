"""The drafts specgguf can make from the user's draft file (a table), and a draft variant's name as a value.

A variant is a re-quantization of the draft (`REQUANTIZATIONS`: a tensor type for the body and one
for the token embedding, which Qwen-style models also use as their output head, the largest single
tensor a small draft reads per token) or the file as given (`original`), optionally cut to a hot
vocabulary of its most written tokens (`+hot32k`: files/hot_vocab.py). `--draft-variant` takes
`auto` (measured here: drafts/made.py) or a variant's name. Its help, its parser and tuning.json's
check of a stored choice all read this table; llama/convert.py gives its types to llama.cpp's
quantizer. No llama_cpp here: the command line reads the table before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import UsageError

ORIGINAL = "original"  # the user's file, as given
Auto = Literal["auto"]
AUTO: Auto = "auto"  # measured here (made.choose)
# A hot vocabulary (files/hot_vocab.py) of this many thousand tokens may follow any base: "q4_0+hot32k".
HOT_SIZES = (16, 32, 64)


@dataclass(frozen=True)
class Requantization:
    name: str
    body: str  # llama.cpp's file type of the body: LLAMA_FTYPE_MOSTLY_<body>
    token_embedding: str  # the ggml type of token_embd (and of a tied output head): GGML_TYPE_<token_embedding>
    note: str


REQUANTIZATIONS: dict[str, Requantization] = {
    row.name: row
    for row in (
        Requantization(
            "q4_0",
            "Q4_0",
            "Q4_0",
            "Q4_0 everywhere: llama.cpp's repacked CPU kernels (AVX2, NEON) for the body, a 4-bit head",
        ),
        Requantization(
            "q4_0-q8head",
            "Q4_0",
            "Q8_0",
            "Q4_0 body, 8-bit token embedding and head (more of the draft's accuracy kept)",
        ),
        Requantization(
            "iq4_nl",
            "IQ4_NL",
            "IQ4_NL",
            "IQ4_NL everywhere: repacked kernels too, fewer bytes per weight, less accurate",
        ),
    )
}


@dataclass(frozen=True)
class Variant:
    """A draft file made from the user's: `base` (ORIGINAL or a REQUANTIZATIONS key), cut to a hot
    vocabulary of `hot_k` thousand (1024) tokens where given."""

    base: str
    hot_k: int | None = None

    @property
    def name(self) -> str:
        """As the user writes it and tuning.json keeps it: "q4_0+hot32k"."""
        return self.base if self.hot_k is None else f"{self.base}+hot{self.hot_k}k"

    @property
    def n_hot(self) -> int | None:
        """The hot vocabulary's size in tokens (None: the whole vocabulary)."""
        return None if self.hot_k is None else self.hot_k * 1024

    @property
    def is_original(self) -> bool:
        return self == ORIGINAL_VARIANT

    @property
    def requantization(self) -> Requantization | None:
        """The base's row of the table (None: the file as given)."""
        return REQUANTIZATIONS.get(self.base)

    def __str__(self) -> str:
        return self.name


ORIGINAL_VARIANT = Variant(ORIGINAL)


def _hot_names() -> str:
    return "/".join(f"hot{size}k" for size in HOT_SIZES)


def parse_variant(text: str) -> Variant:
    """A variant's name as a value; a name that is none is a UsageError saying which are."""
    base, plus, hot = text.partition("+")
    sizes = {f"hot{size}k": size for size in HOT_SIZES}
    if (base == ORIGINAL or base in REQUANTIZATIONS) and (not plus or hot in sizes):
        return Variant(base, sizes[hot] if plus else None)
    raise UsageError(
        f"--draft-variant must be one of {', '.join((AUTO, ORIGINAL, *REQUANTIZATIONS))}, optionally with"
        f" +{_hot_names()} (e.g. q4_0+hot32k), not {text!r}"
    )


def parse_request(text: str) -> Variant | Auto:
    """--draft-variant's value: `auto` or a variant."""
    return AUTO if text == AUTO else parse_variant(text)


def variants_help() -> str:
    """--draft-variant's help, from the table."""
    hot = ", ".join(f"+hot{size}k" for size in HOT_SIZES)
    return (
        "The draft file to use: auto (default: the draft re-quantized for this machine where that measured faster"
        f" here, measured once and kept), original (the file as given) or a variant: {', '.join(REQUANTIZATIONS)},"
        f" each optionally with a hot vocabulary ({hot}: e.g. q4_0+hot32k)."
    )
