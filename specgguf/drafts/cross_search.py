"""Drafts of another vocabulary found among the local models: for a verifier given alone (`-m`
without `-md`) and in `pairs --local`.

- Found: each local model at most about a quarter of the verifier's size (found.MAX_RATIO) that
  does not share its vocabulary, with the share of the verifier's tokens it can propose (its overlap,
  from the pair's map: cross_vocab.pair_map, built once and kept); below MIN_OVERLAP it is left out.
- Ranked after the drafts that share the vocabulary (found.find_draft) unless measured faster
  here: a kept trial's expected rate above the best the same-vocabulary draft's variants measured.
- Measured before it is adopted (`adopt`, asked by prepare.py): its tokens per second through text at
  its best K (made.measure_model, what variants are measured with) against n-gram drafts
  alone on the same calibration set and verify costs (made.ngram_rate); adopted only where it
  beats them and plain decoding. The `Trial` is kept in tuning.json: the next run neither measures
  again nor, where it lost, loads the draft at all.
- In each mode (`choose_mode`, for --cross-mode auto, the default, also for a draft given with -md): its
  shared tokens and its own text re-encoded are two trials, each measured once; the pair drafts in the
  faster (`ModeChoice`), which is what ranks it, what `check`, `pairs --local` and `bench` show, and
  what must beat n-gram drafts alone. A mode that loses is never used unless asked for by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .. import tuning
from ..core.cross_drafter import (
    AUTO_CROSS_MODE,
    CROSS_MODE_NAMES,
    CROSS_MODES,
    DEFAULT_CROSS_MODE,
    CrossMode,
    CrossModeChoice,
    CrossVocab,
    unmeasured_mode,
)
from ..errors import SpecggufError
from ..files.gguf_header import SummaryIndex
from ..files.local_models import LocalModel, local_models
from ..llama.compat import VocabInfo, vocabularies_match
from ..llama.loaded import LoadedModel
from .cross_vocab import pair_map
from .found import MAX_RATIO, Found, FoundDraft, LocalPair, find_draft, local_pairs, scan, vocab_match
from .made import measure_model, ngram_rate

# Below this share of the verifier's tokens the two hardly share a script: not worth a trial. Only a floor:
# string-level drafting proposes any text the draft writes (SmolLM2-135M shares 26% of Qwen2.5's tokens and
# is kept 83% of the time on code), so the overlap ranks the candidates and the trial decides.
MIN_OVERLAP = 0.05
TRIAL = "cross_trial"  # its tuning.json entries: tuning.draft_variant_key(draft, verifier, TRIAL)


def trial_name(mode: CrossMode) -> str:
    """A trial's tuning.json name per mode (the intersection mode's is the first round's, unchanged)."""
    return TRIAL if mode == "tokens" else f"{TRIAL}_{mode}"


@dataclass(frozen=True)
class Trial:
    """A found draft of another vocabulary as measured here against its verifier, beside n-gram drafts
    alone and plain decoding (tokens per second, priced on the same verify costs)."""

    ms_per_token: float
    acceptance: float
    expected_tokens_per_second: float  # the draft (through text) at its best fixed K
    ngram_tokens_per_second: float
    plain_tokens_per_second: float

    @property
    def adopted(self) -> bool:
        return self.expected_tokens_per_second > max(self.ngram_tokens_per_second, self.plain_tokens_per_second)

    def describe(self) -> str:
        return (
            f"{self.expected_tokens_per_second:.1f} tok/s expected (acceptance {self.acceptance:.2f},"
            f" {self.ms_per_token:.1f} ms/token) against {self.ngram_tokens_per_second:.1f} with n-gram drafts"
            f" alone and {self.plain_tokens_per_second:.1f} plain"
        )

    def as_json(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, value: object) -> Trial:
        names = [field.name for field in fields(cls)]
        if not isinstance(value, dict) or set(value) != set(names):
            raise tuning.InvalidEntry(f"expected an object with exactly {', '.join(names)}")
        for name in names:
            number = value[name]
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise tuning.InvalidEntry(f"{name!r} is {number!r}")
            if number < 0:
                raise tuning.InvalidEntry(f"{name!r} is {number!r}")
        return cls(*(float(value[name]) for name in names))


Measure = Callable[[LoadedModel, LoadedModel, CrossVocab], Trial]


def measure_trial(verifier: LoadedModel, draft: LoadedModel, cross: CrossVocab) -> Trial:
    """The draft through text against n-gram drafts alone, on this machine's verify costs (tuning.probe)."""
    verify = tuning.probe(verifier).verify
    measured = measure_model(verifier, draft, verify, cross=cross)
    return Trial(
        measured.ms_per_token,
        measured.acceptance,
        measured.expected_tokens_per_second,
        round(ngram_rate(verifier, verify), 2),
        round(1.0 / verify[0], 2),
    )


def adopt(
    verifier: LoadedModel,
    draft: LoadedModel,
    cross: CrossVocab,
    *,
    measure: Measure | None = None,
    announce: Callable[[str], None] | None = None,
) -> Trial:
    """The kept trial of this found draft against this verifier here in its mode (`cross.mode`), else
    measured now (`measure`, measure_trial unless a caller gives another) and kept. Its `adopted` says
    whether to draft with it."""
    key = tuning.draft_variant_key(draft.path, verifier, trial_name(cross.mode))
    trial = tuning.stored_entry(key, Trial.from_json)
    if trial is None:
        if announce is not None:
            announce(
                f"measuring the draft of another vocabulary ({CROSS_MODE_NAMES[cross.mode]}) against n-gram drafts"
                " alone (once; kept in tuning.json)"
            )
        trial = (measure or measure_trial)(verifier, draft, cross)
        tuning.keep_entry(key, trial.as_json())
    return trial


@dataclass(frozen=True)
class ModeChoice:
    """How a draft of another vocabulary drafts for a verifier here: the mode whose trial expects the
    most tokens per second (DEFAULT_CROSS_MODE on a tie), with each mode's trial."""

    trials: dict[CrossMode, Trial]

    @property
    def mode(self) -> CrossMode:
        return max(
            self.trials,
            key=lambda mode: (self.trials[mode].expected_tokens_per_second, mode == DEFAULT_CROSS_MODE),
        )

    @property
    def trial(self) -> Trial:
        return self.trials[self.mode]

    @property
    def open(self) -> bool:
        """Adopted, or a mode not measured yet (which may be)."""
        return self.trial.adopted or self.partial

    @property
    def partial(self) -> bool:
        """Some mode not measured yet."""
        return set(self.trials) != set(CROSS_MODES)

    def describe(self) -> str:
        """The chosen mode first, then the others' expected rates."""
        others = [
            f"{CROSS_MODE_NAMES[mode]} {trial.expected_tokens_per_second:.1f} tok/s"
            for mode, trial in self.trials.items()
            if mode != self.mode
        ]
        return f"{CROSS_MODE_NAMES[self.mode]}: {self.trial.describe()}" + "".join(f"; {other}" for other in others)


def choose_mode(
    verifier: LoadedModel,
    draft: LoadedModel,
    cross: CrossVocab,
    modes: tuple[CrossMode, ...] = CROSS_MODES,
    *,
    measure: Measure | None = None,
    announce: Callable[[str], None] | None = None,
) -> ModeChoice:
    """Each of `modes` kept or measured here for this pair (`adopt`, once each), and the faster."""
    return ModeChoice(
        {mode: adopt(verifier, draft, replace(cross, mode=mode), measure=measure, announce=announce) for mode in modes}
    )


def stored_choice(draft: Path, verifier: Path) -> ModeChoice | None:
    """The modes kept here for this draft and verifier file, at any thread count (for ranking before
    loading); None where none was measured."""
    trials = {}
    for mode in CROSS_MODES:
        kept = tuning.stored_at_any_threads(trial_name(mode), draft, verifier, Trial.from_json)
        if kept:
            trials[mode] = kept[0][1]
    return ModeChoice(trials) if trials else None


def kept_mode(choice: CrossModeChoice, draft: Path, verifier: Path) -> CrossMode:
    """The mode a choice means for this pair without measuring (bench): "auto", the one kept here as
    faster if both were measured, else the default."""
    kept = stored_choice(draft, verifier) if choice == AUTO_CROSS_MODE else None
    return kept.mode if kept is not None and not kept.partial else unmeasured_mode(choice)


@dataclass(frozen=True)
class CrossDraft:
    """A local model of another vocabulary that could draft for a verifier, and what it shares."""

    model: LocalModel
    size: int
    overlap: float  # of the verifier's tokens, the share it can propose
    measured: ModeChoice | None = None  # measured here before, if it was (in one mode or both)

    @property
    def trial(self) -> Trial | None:
        """The trial of the mode it would draft in, if measured."""
        return None if self.measured is None else self.measured.trial

    @property
    def why(self) -> str:
        return f"{self.model.ref}: other vocabulary, {self.overlap:.0%} of the verifier's tokens shared"

    def rank(self) -> tuple:
        """Measured and adopted first (fastest first), then unmeasured (most overlap first), then declined."""
        if self.trial is None:
            return (1, -self.overlap, self.size)
        return (0 if self.trial.adopted else 2, -self.trial.expected_tokens_per_second, self.size)


def _overlap(draft: Path, draft_info: VocabInfo, verifier: Path, verifier_info: VocabInfo) -> float:
    return pair_map(draft_info, verifier_info, draft_path=draft, verifier_path=verifier).overlap


def _vocab(path: Path, seen: dict[Path, VocabInfo]) -> VocabInfo:
    """llama.cpp's reading of a file's vocabulary (no weights), once per call of the caller's."""
    from ..llama.vocab import read_vocab

    if path not in seen:
        seen[path] = read_vocab(path)[0]
    return seen[path]


def cross_drafts(
    verifier: Path,
    found: list[Found],
    index: SummaryIndex,
    seen: dict[Path, VocabInfo] | None = None,
    *,
    measured_only: bool = False,
) -> list[CrossDraft]:
    """The models among `found` of another vocabulary that could draft for `verifier`, best first
    (`seen`: vocabularies read already; `measured_only`: only those with a kept trial, read nothing else)."""
    seen = {} if seen is None else seen
    try:
        ours = index.get(verifier)
    except (SpecggufError, OSError):
        return []
    real = verifier.resolve()
    candidates = [
        (item, stored_choice(item.model.path, verifier))
        for item in found
        if item.summary.size <= MAX_RATIO * ours.size
        and item.model.path.resolve() != real
        and not vocab_match(ours, item.summary)
    ]
    others = [(item, measured) for item, measured in candidates if not (measured_only and measured is None)]
    try:
        verifier_info = _vocab(verifier, seen) if others else None
    except SpecggufError:
        return []
    drafts = []
    for item, measured in others:
        assert verifier_info is not None
        try:
            info = _vocab(item.model.path, seen)
        except SpecggufError:
            continue  # llama.cpp cannot read it: never a draft
        if vocabularies_match(verifier_info, info):
            continue
        overlap = _overlap(item.model.path, info, verifier, verifier_info)
        if overlap >= MIN_OVERLAP:
            drafts.append(CrossDraft(item.model, item.summary.size, overlap, measured))
    return sorted(drafts, key=CrossDraft.rank)


def _same_rate(draft: Path, verifier: Path) -> float | None:
    """The best rate the same-vocabulary draft's variants measured here, if they were."""
    rates = [entry.best.expected_tokens_per_second for _, entry in tuning.stored_draft_variants(draft, verifier)]
    return max(rates, default=None)


def find_any_draft(verifier: Path) -> FoundDraft | None:
    """The draft for a verifier given alone: found.py's (a registry pair, the smallest draft sharing the
    vocabulary), else or where measured faster a draft of another vocabulary (`cross` set: prepare.py
    measures it against n-gram drafts alone before adopting it). None: the verifier cannot be read."""
    same = find_draft(verifier)
    if same is None:
        return None
    index = SummaryIndex()
    found = scan(local_models(), index, warn=False)  # find_draft warned of what it could not read
    crosses = cross_drafts(verifier, found, index, measured_only=same.draft is not None)
    index.save()
    usable = [draft for draft in crosses if draft.measured is None or draft.measured.open]
    if same.draft is not None:
        same_rate = _same_rate(same.draft, verifier)
        faster = [
            draft
            for draft in usable
            if draft.trial is not None and same_rate is not None and draft.trial.expected_tokens_per_second > same_rate
        ]
        if not faster:
            return same
        best = faster[0]
        assert best.measured is not None
        return FoundDraft(
            best.model.path,
            f"draft: {best.why}; measured here faster than the draft that shares it ({best.measured.describe()})",
            cross=True,
        )
    if usable:
        best = usable[0]
        measured = (
            f"; measured here: {best.measured.describe()}"
            if best.measured is not None
            else "; measured against n-gram drafts alone before it is used"
        )
        return FoundDraft(best.model.path, f"draft: {best.why}{measured}", cross=True)
    if crosses:
        declined = crosses[0]
        assert declined.measured is not None
        return FoundDraft(
            None,
            f"{same.message}; {declined.why}, measured here slower: {declined.measured.describe()}",
        )
    return same


@dataclass(frozen=True)
class CrossPair:
    """`pairs --local`: a draft of another vocabulary for a local verifier (cli/pairs.py shows it)."""

    draft: CrossDraft
    verifier: LocalModel
    verifier_size: int


def all_local_pairs() -> tuple[list[LocalPair], list[CrossPair]]:
    """`pairs --local`: the pairs that share a vocabulary (found.local_pairs), and each local
    model's drafts of another vocabulary (at most ~1/4 its size), best first per verifier."""
    index = SummaryIndex()
    found = scan(local_models(), index)
    seen: dict[Path, VocabInfo] = {}
    crosses = [
        CrossPair(draft, verifier.model, verifier.summary.size)
        for verifier in found
        for draft in cross_drafts(verifier.model.path, found, index, seen)
    ]
    index.save()
    return local_pairs(found), crosses
