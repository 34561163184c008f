"""A draft made for this machine: the draft re-quantized to kernels this CPU runs fast, chosen by measurement.

The acceptance rule is exact for any draft distribution, so a draft may be changed freely (the
verifier's file never is). prepare.py asks once (`load_chosen`), and the choice is one pass down:

- what to try: `auto` tries the original and AUTO_CANDIDATES (rows of llama/variants.py's
  table, each optionally with a hot vocabulary cut from it, `+hot32k`: files/hot_vocab.py); a
  name asks for that variant alone;
- the files made: each derived once from the user's draft file into the cache folder (`derive`,
  at files/derived.py's path: the file's SHA-256 and the variant; the user's file is never touched);
- what was measured (`calibrate`), on this machine, against this verifier: each file's cost per
  draft token (a batch of one, logits read: what drafting pays) and its acceptance (the chance a
  draft position is accepted given the ones before it were, from greedy speculation at K = 4 on a
  short calibration set, code and prose: core/calibration.py), scored by the tokens per second it should give at its
  best fixed K, E(k) / T(k) with E(k) = (1 − a^(k+1)) / (1 − a) and T(k) = k·t_draft + t_verify(k + 1)
  (core/calibration.expected_rate); kept in tuning.json (`tuning.MeasuredVariants`), so measured once
  (`measure_model` measures one loaded draft; drafts/cross_search.py measures a found draft of another
  vocabulary with it, against `ngram_rate`, n-gram drafts alone on the same set and costs);
- the choice (`pick`), then the chosen file loaded (`open_draft`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import tuning
from ..conversation import Prompts
from ..core import calibration
from ..core.costs import PROBE_CONTEXT, MachineCosts, measure
from ..core.cross_drafter import DEFAULT_CROSS_MODE, CrossMode, CrossVocab
from ..core.hot_vocab import HotVocab
from ..errors import ModelLoadError
from ..files import hot_vocab
from ..files.assets import DERIVED_DRAFTS, cache_dir
from ..files.derived import counts_path, derived_path
from ..files.partial import cannot_write_in, partial_file
from ..files.small_files import read_npy
from ..llama.loaded import LoadedModel, ModelSettings
from ..llama.variants import ORIGINAL_VARIANT, Auto, Variant
from ..tuning import Candidate, MeasuredVariants

# Below this size a draft is used as given: its cost is llama.cpp's per-call overhead, not its weights.
MIN_DERIVED_BYTES = 64 << 20
# What auto measures: the variants that won in the ablation (docs/benchmarks.md). IQ4_NL's quantizer
# takes about a minute for a 0.5B model on two cores, and a hot vocabulary only matched q4_0 end to
# end (for a verifier run's counting and a second file): both are there by name.
AUTO_CANDIDATES = (Variant("q4_0"), Variant("q4_0-q8head"))
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
class DraftChoice:
    """Which draft file loads, and why (for the stats line, --json, `check` and `bench`)."""

    variant: Variant
    path: Path
    why: str
    candidates: tuple[Candidate, ...] = ()
    cross: bool = False  # of another vocabulary: used as given, it drafts through the text (drafts/cross_vocab.py)
    cross_mode: CrossMode = (
        DEFAULT_CROSS_MODE  # and how: shared tokens, or its own text re-encoded (core/string_drafter.py)
    )

    @property
    def name(self) -> str:
        return self.variant.name


# --- the files made ---
def written_counts(verifier: LoadedModel) -> np.ndarray:
    """How often `verifier` writes each token, greedy, on the hot-vocabulary calibration set (its
    answers, drafted by n-grams alone: the same tokens, sooner); kept in the cache folder."""
    kept = counts_path(verifier.path)
    try:
        counts = read_npy(kept, dtype=np.int64, length=verifier.n_vocab)
        if counts.min() >= 0:
            return counts
    except (OSError, ValueError):
        pass  # not there yet, or damaged: counted again
    counts = _count_answers(verifier)
    with partial_file(kept) as partial, partial.open("wb") as out:
        np.save(out, counts)
    return counts


def _count_answers(verifier: LoadedModel) -> np.ndarray:
    questions = _questions(verifier, HOT_CALIBRATION)
    return calibration.written_counts(verifier, questions, k=CALIBRATION_K, max_tokens=HOT_CALIBRATION_TOKENS)


def _questions(verifier: LoadedModel, texts: tuple[str, ...]) -> list[list[int]]:
    """The calibration questions as the verifier's prompt tokens (its chat template)."""
    prompts = Prompts(verifier)
    return [prompts.question(text, raw=False, system=None) for text in texts]


def derive(
    source: Path, variant: Variant, verifier: LoadedModel | None = None, announce: Callable[[str], None] | None = None
) -> Path:
    """The variant of `source` in the cache, made now if it is not there yet (a hot vocabulary is cut
    from its base, which is made first, with the tokens `verifier` writes ranked first where given);
    `announce(text)` is told before anything is made."""
    from ..llama.convert import requantize_draft

    if variant.n_hot is not None:
        path = derived_path(source, variant.name, None if verifier is None else verifier.path)
        if not all(p.is_file() for p in (path, hot_vocab.sidecar(path), hot_vocab.rows_file(path))):
            if announce is not None:
                announce(f"making the {variant} draft (once; the verifier's answers are counted first)")
            counts = None if verifier is None else written_counts(verifier)
            base = Variant(variant.base)
            cut_from = source if base.is_original else derive(source, base, announce=announce)
            hot_vocab.build(cut_from, path, n_hot=variant.n_hot, counts=counts)
        return path
    path = derived_path(source, variant.name)
    row = variant.requantization
    assert row is not None, "the original is used as given, never derived"
    if not path.is_file():
        if announce is not None:
            announce(f"making the {variant} draft (once)")
        requantize_draft(source, path, row)
    return path


def open_draft(path: Path, settings: ModelSettings) -> LoadedModel:
    """The draft model at `path`; a hot-vocabulary file is seen over the whole vocabulary."""
    maps = hot_vocab.load_maps(path)
    model = settings.load(path)
    if maps is None:
        return model
    if len(maps.ids) != model.n_vocab:
        model.close()
        raise ModelLoadError(
            f"{hot_vocab.sidecar(path)}: {len(maps.ids)} ids for the {model.n_vocab} tokens of its model;"
            " delete it to rebuild"
        )
    n_embd = getattr(model, "n_embd", None)
    if maps.rows is not None and n_embd is not None and maps.rows.n_embd != n_embd:
        model.close()
        table = hot_vocab.rows_file(path)
        raise ModelLoadError(f"{table}: rows of {maps.rows.n_embd}, not the model's {n_embd}; delete it to rebuild")
    return HotVocab(model, maps.ids, maps.feed, maps.rows)


# --- what was measured ---
def calibrate(
    verifier: LoadedModel, files: dict[Variant, Path], verify: tuple[float, ...], *, settings: ModelSettings
) -> list[Candidate]:
    """Measure each draft file here against `verifier` (whose verify costs by batch size are
    `verify`), each loaded with `settings` and closed after."""
    candidates = []
    for variant, path in files.items():
        draft = open_draft(path, settings)
        try:
            candidates.append(measure_model(verifier, draft, verify, variant=variant))
        finally:
            draft.close()
    return candidates


def measure_model(
    verifier: LoadedModel,
    draft: LoadedModel,
    verify: tuple[float, ...],
    *,
    variant: Variant = ORIGINAL_VARIANT,
    cross: CrossVocab | None = None,
) -> Candidate:
    """One loaded draft measured here against `verifier` (through text where `cross` is given: a draft
    of another vocabulary): its cost per draft token, its acceptance on the calibration set, and the
    tokens per second that should give at its best fixed K."""
    (seconds,) = measure(draft, max_batch=1, repeats=5, context=PROBE_CONTEXT, statistic=min)
    acceptance = calibration.acceptance(
        verifier, draft, _questions(verifier, CALIBRATION), k=CALIBRATION_K, max_tokens=CALIBRATION_TOKENS, cross=cross
    )
    rate = calibration.expected_rate(MachineCosts(verify, seconds), acceptance)
    return Candidate(variant, round(seconds * 1000, 3), round(acceptance, 4), round(rate, 2))


def ngram_rate(verifier: LoadedModel, verify: tuple[float, ...]) -> float:
    """Tokens per second n-gram drafts alone should give here on the same calibration set, priced on
    the same verify costs (core/calibration.py's `ngram_rate`): what a found draft must beat."""
    questions = _questions(verifier, CALIBRATION)
    return calibration.ngram_rate(verifier, questions, verify, k=CALIBRATION_K, max_tokens=CALIBRATION_TOKENS)


# --- the choice ---
def pick(candidates: list[Candidate], verify: tuple[float, ...]) -> Variant:
    """The candidate with the most expected tokens per second, where one beats plain decoding here
    (1 / t_verify(1)); else the original: where no draft model can win, the K policy leaves it out
    anyway, and a cheaper draft only tempts the policy's probes into losing steps (docs/benchmarks.md)."""
    best = max(candidates, key=lambda candidate: candidate.expected_tokens_per_second)
    return best.variant if best.expected_tokens_per_second > 1.0 / verify[0] else ORIGINAL_VARIANT


def made_files(source: Path, variants: tuple[Variant, ...], verifier: LoadedModel) -> dict[Variant, Path]:
    """The file for each of `variants` (the original: `source` itself), each derived once; a variant
    that cannot be made from this file is left out."""
    files = {}
    for variant in variants:
        try:
            files[variant] = source if variant.is_original else derive(source, variant, verifier)
        except ModelLoadError:  # not for this file (a hot vocabulary as large as its whole vocabulary)
            continue
    return files


def measure_here(
    verifier: LoadedModel, source: Path, settings: ModelSettings
) -> tuple[MeasuredVariants, dict[Variant, Path]]:
    """What `auto` tries (the original and AUTO_CANDIDATES), the files made for it, what each
    measured here, and the choice: each step once. The files come back with it."""
    verify = tuning.probe(verifier).verify
    files = made_files(source, (ORIGINAL_VARIANT, *AUTO_CANDIDATES), verifier)
    candidates = calibrate(verifier, files, verify, settings=settings)
    return MeasuredVariants(pick(candidates, verify), tuple(candidates)), files


def choose(
    verifier: LoadedModel,
    source: Path,
    requested: Variant | Auto,
    *,
    settings: ModelSettings,
    announce: Callable[[str], None] | None = None,
) -> DraftChoice:
    """The draft file to load for `requested` (auto, or a variant: the original is one); with auto,
    measured here once (`measure_here`, with draft models loaded by `settings`) and kept in tuning.json."""
    if isinstance(requested, Variant):
        if requested.is_original:
            return DraftChoice(requested, source, "--draft-variant original")
        return DraftChoice(requested, derive(source, requested, verifier, announce), f"--draft-variant {requested}")
    if source.stat().st_size < MIN_DERIVED_BYTES:
        return DraftChoice(ORIGINAL_VARIANT, source, "a small draft is used as given")
    if (unwritable := cannot_write_in(cache_dir() / DERIVED_DRAFTS)) is not None:
        return DraftChoice(ORIGINAL_VARIANT, source, f"the draft as given: {unwritable}")
    key = tuning.draft_variant_key(source, verifier)
    measured = tuning.stored_draft_variant(key)
    files = {ORIGINAL_VARIANT: source}
    if measured is None:
        if announce is not None:
            announce("making a draft for this machine (once; measured and kept in tuning.json)")
        measured, files = measure_here(verifier, source, settings)
        tuning.keep_draft_variant(key, measured)
    best = measured.best
    path = files[best.variant] if best.variant in files else derive(source, best.variant, verifier)
    return DraftChoice(best.variant, path, f"measured here: {best.describe()}", measured.candidates)


def load_chosen(
    verifier: LoadedModel,
    original: LoadedModel,
    requested: Variant | Auto,
    *,
    settings: ModelSettings,
    announce: Callable[[str], None] | None = None,
) -> tuple[LoadedModel, DraftChoice]:
    """The draft to run for `requested`, and why: `original` (the user's file, loaded and paired by
    the caller, who closes it if it is not returned) where that is the choice, else the chosen
    variant, loaded with `settings`."""
    choice = choose(verifier, original.path, requested, settings=settings, announce=announce)
    if choice.variant.is_original:
        return original, choice  # loaded once: the file as given is the one chosen
    return open_draft(choice.path, settings), choice
