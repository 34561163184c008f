"""A draft made for this machine: the draft re-quantized to kernels this CPU runs fast, chosen by measurement.

The acceptance rule is exact for any draft distribution, so a draft may be changed freely (the
verifier's file never is). `llama/convert.py`'s `DRAFT_VARIANTS` are the candidates, each
optionally with a hot vocabulary cut from it (`+hot32k`: files/hot_vocab.py); each is
derived once from the user's draft file into the cache folder (keyed by the file's SHA-256 and the
variant; the user's file is never touched), and `calibrate` measures, on this machine, against
this verifier:

- its cost per draft token (a batch of one, logits read: what drafting pays), and
- its acceptance: the chance a draft position is accepted given the ones before it were, from
  greedy speculation at K = 4 on a short calibration set (code and prose);

and scores each by the tokens per second it should give at its best fixed K, E(k) / T(k) with
E(k) = (1 − a^(k+1)) / (1 − a) and T(k) = k·t_draft + t_verify(k + 1) (core/kpolicy.expected_rate).
The best is kept in tuning.json with the machine's other costs; `--draft-variant auto` (the default)
uses it, `original` the file as given, a name that variant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import tuning
from .conversation import Prompts
from .core.costs import PROBE_CONTEXT, MachineCosts, measure
from .core.drafters import DraftSettings, build_drafter
from .core.engine import FixedK, speculate
from .core.hot_vocab import HotVocab
from .core.kpolicy import expected_rate
from .core.sampling import SamplingSettings
from .errors import ModelLoadError, UsageError
from .files import hot_vocab
from .files.assets import DERIVED_DRAFTS, cache_dir
from .files.partial import cannot_write_in, partial_file
from .files.stamps import sha256_hex, stamped_sha256, write_stamp

ORIGINAL = "original"
AUTO = "auto"
# Below this size a draft is used as given: its cost is llama.cpp's per-call overhead, not its weights.
MIN_DERIVED_BYTES = 64 << 20
# What auto measures: the variants that won in the ablation (docs/benchmarks.md). IQ4_NL's quantizer
# takes about a minute for a 0.5B model on two cores, and a hot vocabulary only matched q4_0 end to
# end (for a verifier run's counting and a second file): both are there by name.
AUTO_CANDIDATES = ("q4_0", "q4_0-q8head")
# A hot vocabulary (files/hot_vocab.py) of this many thousand tokens may follow any base: "q4_0+hot32k".
HOT_SIZES = (16, 32, 64)
CALIBRATION = (
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Explain in a few sentences how a hash table works.",
)
CALIBRATION_TOKENS = 48
CALIBRATION_K = 4
# What a hot vocabulary's ranking counts: the verifier's own answers, code and prose (none of them is
# a `bench` prompt, which measure it).
HOT_CALIBRATION = (
    *CALIBRATION,
    "Write a JavaScript function that debounces another function, and show how to use it.",
    "Write a SQL query that returns the ten customers with the most orders last month.",
    "Describe the water cycle for a ten-year-old.",
    "Write a short, friendly email asking a colleague to review a pull request.",
)
HOT_CALIBRATION_TOKENS = 96


@dataclass(frozen=True)
class Candidate:
    name: str  # ORIGINAL or a DRAFT_VARIANTS key
    ms_per_token: float
    acceptance: float  # per position, given the earlier ones accepted
    expected_tokens_per_second: float

    def describe(self) -> str:
        return (
            f"{self.name}: {self.ms_per_token:.1f} ms/token, acceptance {self.acceptance:.2f}"
            f" → {self.expected_tokens_per_second:.1f} tok/s expected at its best K"
        )


@dataclass(frozen=True)
class DraftChoice:
    """Which draft file loads, and why (for the stats line, --json, `check` and `bench`)."""

    name: str
    path: Path
    why: str
    candidates: tuple[Candidate, ...] = ()


def variant_names() -> tuple[str, ...]:
    from .llama.convert import DRAFT_VARIANTS

    return (AUTO, ORIGINAL, *DRAFT_VARIANTS)


def split(name: str) -> tuple[str, int | None]:
    """ "q4_0+hot32k" -> ("q4_0", 32768); "q4_0" -> ("q4_0", None)."""
    base, _, hot = name.partition("+")
    return base, int(hot[3:-1]) * 1024 if hot else None


def parse_variant(text: str) -> str:
    base, _, hot = text.partition("+")
    hot_ok = not hot or hot in {f"hot{size}k" for size in HOT_SIZES}
    if base not in variant_names() or not hot_ok or (hot and base == AUTO):
        sizes = "/".join(f"hot{size}k" for size in HOT_SIZES)
        raise UsageError(
            f"--draft-variant must be one of {', '.join(variant_names())}, optionally with +{sizes}"
            f" (e.g. q4_0+hot32k), not {text!r}"
        )
    return text


def derived_path(source: Path, name: str, verifier: Path | None = None) -> Path:
    """Where the variant of `source` lives: the cache folder, by the source's SHA-256 (hashed once;
    a stamp beside the cache remembers it while the file's size and mtime stay the same), and for a
    hot vocabulary counted on a verifier's answers, that verifier (its name and size)."""
    folder = cache_dir() / DERIVED_DRAFTS
    stamp = folder / f"{hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:24]}.sha256"
    digest = stamped_sha256(source, stamp=stamp)
    if digest is None:
        digest = sha256_hex(source)
        write_stamp(source, digest, stamp=stamp)
    if verifier is None:
        return folder / f"{digest[:24]}-{name}.gguf"
    return folder / f"{digest[:24]}-{name}-for-{_verifier_id(verifier)}.gguf"


def _verifier_id(verifier: Path) -> str:
    return hashlib.sha256(f"{verifier.name}|{verifier.stat().st_size}".encode()).hexdigest()[:12]


def written_counts(verifier) -> np.ndarray:
    """How often `verifier` writes each token, greedy, on the hot-vocabulary calibration set (its
    answers, drafted by n-grams alone: the same tokens, sooner); kept in the cache folder."""
    kept = cache_dir() / DERIVED_DRAFTS / f"written-by-{_verifier_id(Path(verifier.path))}.npy"
    try:
        counts = np.load(kept, allow_pickle=False)
        if counts.shape == (verifier.n_vocab,) and counts.dtype == np.int64 and counts.min() >= 0:
            return counts
    except (OSError, ValueError):
        pass  # not there yet, or damaged: counted again
    counts = _count_answers(verifier)
    with partial_file(kept) as partial, partial.open("wb") as out:
        np.save(out, counts)
    return counts


def _count_answers(verifier) -> np.ndarray:
    counts = np.zeros(verifier.n_vocab, dtype=np.int64)
    prompts = Prompts(verifier)
    for question in HOT_CALIBRATION:
        events = speculate(
            verifier=verifier,
            drafter=build_drafter("ngram", None),
            prompt_tokens=prompts.question(question, raw=False, system=None),
            k=FixedK(CALIBRATION_K),
            max_tokens=HOT_CALIBRATION_TOKENS,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )
        for event in events:
            np.add.at(counts, np.asarray(event.tokens, dtype=np.int64), 1)
    verifier.rewind(0)
    return counts


def derive(source: Path, name: str, verifier=None, announce: Callable[[str], None] | None = None) -> Path:
    """The variant of `source` in the cache, made now if it is not there yet (a hot vocabulary is cut
    from its base, which is made first, with the tokens `verifier` writes ranked first where given);
    `announce(text)` is told before anything is made."""
    from .llama.convert import DRAFT_VARIANTS, requantize

    base, n_hot = split(name)
    if n_hot is not None:
        path = derived_path(source, name, None if verifier is None else Path(verifier.path))
        if not all(p.is_file() for p in (path, hot_vocab.sidecar(path), hot_vocab.rows_file(path))):
            if announce is not None:
                announce(f"making the {name} draft (once; the verifier's answers are counted first)")
            counts = None if verifier is None else written_counts(verifier)
            cut_from = source if base == ORIGINAL else derive(source, base, announce=announce)
            hot_vocab.build(cut_from, path, n_hot=n_hot, counts=counts)
        return path
    path = derived_path(source, name)
    variant = DRAFT_VARIANTS[name]
    if not path.is_file():
        if announce is not None:
            announce(f"making the {name} draft (once)")
        requantize(source, path, ftype=variant.ftype, token_embedding=variant.token_embedding)
    return path


def open_draft(path: Path, load: Callable[[Path], Any]) -> Any:
    """The draft model at `path`; a hot-vocabulary file is seen over the whole vocabulary."""
    maps = hot_vocab.load_maps(path)
    model = load(path)
    if maps is None:
        return model
    if len(maps.ids) != model.n_vocab:
        model.close()
        raise ModelLoadError(
            f"{hot_vocab.sidecar(path)}: {len(maps.ids)} ids for the {model.n_vocab} tokens of its model;"
            " delete it to rebuild"
        )
    if maps.rows is not None and maps.rows.n_embd != getattr(model, "n_embd", maps.rows.n_embd):
        model.close()
        table = hot_vocab.rows_file(path)
        raise ModelLoadError(
            f"{table}: rows of {maps.rows.n_embd}, not the model's {model.n_embd}; delete it to rebuild"
        )
    return HotVocab(model, maps.ids, maps.feed, maps.rows)


def _acceptance(verifier, draft) -> float:
    """Per-position acceptance of `draft` against `verifier`: greedy, K fixed, on the calibration set."""
    prompts = Prompts(verifier)
    accepted = tested = 0
    for question in CALIBRATION:
        tokens = prompts.question(question, raw=False, system=None)
        events = speculate(
            verifier=verifier,
            drafter=build_drafter("model", draft, DraftSettings()),
            prompt_tokens=tokens,
            k=FixedK(CALIBRATION_K),
            max_tokens=CALIBRATION_TOKENS,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )
        for event in events:
            accepted += event.n_accepted
            # A position is tested only if the ones before it were accepted: the first rejection ends it.
            tested += min(event.n_accepted + 1, event.n_drafted)
    verifier.rewind(0)
    return accepted / tested if tested else 0.0


def calibrate(
    verifier,
    source: Path,
    verify: tuple[float, ...],
    *,
    names: tuple[str, ...],
    load: Callable[[Path], Any],
    on_step: Callable[[str], None] | None = None,
) -> list[Candidate]:
    """Measure the original draft and each variant in `names` here, against `verifier` (whose verify
    costs by batch size are `verify`); `load(path)` loads a draft model (closed after)."""
    candidates = []
    for name in (ORIGINAL, *names):
        if on_step is not None:
            on_step(name)
        try:
            path = source if name == ORIGINAL else derive(source, name, verifier)
        except ModelLoadError:  # not for this file (a hot vocabulary as large as its whole vocabulary)
            continue
        draft = open_draft(path, load)
        try:
            (seconds,) = measure(draft, max_batch=1, repeats=5, context=PROBE_CONTEXT, statistic=min)
            acceptance = _acceptance(verifier, draft)
        finally:
            draft.close()
        rate = expected_rate(MachineCosts(verify, seconds), acceptance)
        candidates.append(Candidate(name, round(seconds * 1000, 3), round(acceptance, 4), round(rate, 2)))
    return candidates


def choose(
    verifier,
    source: Path,
    requested: str,
    *,
    load: Callable[[Path], Any],
    announce: Callable[[str], None] | None = None,
) -> DraftChoice:
    """The draft file to load for `requested` (auto, original or a variant's name)."""
    if requested == ORIGINAL:
        return DraftChoice(ORIGINAL, source, "--draft-variant original")
    if requested != AUTO:
        path = derive(source, requested, verifier, announce)
        return DraftChoice(requested, path, f"--draft-variant {requested}")
    if source.stat().st_size < MIN_DERIVED_BYTES:
        return DraftChoice(ORIGINAL, source, "a small draft is used as given")
    if (unwritable := cannot_write_in(cache_dir() / DERIVED_DRAFTS)) is not None:
        return DraftChoice(ORIGINAL, source, f"the draft as given: {unwritable}")
    key = tuning.draft_variant_key(source, verifier)
    stored = tuning.stored_draft_variant(key)
    if stored is None:
        if announce is not None:
            announce("making a draft for this machine (once; measured and kept in tuning.json)")
        verify = tuning.probe(verifier).verify
        candidates = calibrate(verifier, source, verify, names=AUTO_CANDIDATES, load=load)
        stored = {"choice": pick(candidates, verify), "candidates": [vars(candidate) for candidate in candidates]}
        tuning.keep_draft_variant(key, stored)
    measured = tuple(Candidate(**entry) for entry in stored["candidates"])
    best = next(candidate for candidate in measured if candidate.name == stored["choice"])
    path = source if best.name == ORIGINAL else derive(source, best.name, verifier)
    return DraftChoice(best.name, path, f"measured here: {best.describe()}", measured)


def pick(candidates: list[Candidate], verify: tuple[float, ...]) -> str:
    """The candidate with the most expected tokens per second, where one beats plain decoding here
    (1 / t_verify(1)); else the original: where no draft model can win, the K policy leaves it out
    anyway, and a cheaper draft only tempts the policy's probes into losing steps (docs/benchmarks.md)."""
    best = max(candidates, key=lambda candidate: candidate.expected_tokens_per_second)
    return best.name if best.expected_tokens_per_second > 1.0 / verify[0] else ORIGINAL
