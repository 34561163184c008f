"""The drafter kinds, as one table: what each needs, which sources its drafts come from, how to build it.

Everyone who must know a kind reads its row: the set-up path (does it load a draft model?),
the K policy (one adaptive policy per source), the server's request model and the CLI (the
names and their help). A new kind is a new drafter module and a new row here; the one kind that only
picks between two others' proposals step by step, `HybridDrafter`, is here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from ..errors import UsageError
from .cross_drafter import CROSS_MODE_CHOICES, CrossModeChoice, CrossVocab, CrossVocabDrafter
from .drafting import Drafter, Drafts, DraftStep, Guess, Source
from .model import Model
from .model_drafter import ModelDrafter
from .ngram_cache import SessionNgrams
from .ngram_drafter import Match, NgramDrafter
from .rounds import K_MAX
from .string_drafter import StringDrafter

DrafterKind = Literal["model", "ngram", "hybrid", "cross"]  # as the command line and the server name them


@dataclass(frozen=True)
class DraftSettings:
    """What building a drafter takes besides the draft model."""

    p_min: float = 0.0  # the draft model's early stop: below this top probability ...
    n_min: int = 0  # ... after at least this many drafts
    session: SessionNgrams | None = None  # the n-gram cache the n-gram side drafts from and teaches
    cross: CrossVocab | None = None  # a draft of another vocabulary: how it reads and proposes (drafts/cross_vocab.py)


@dataclass(frozen=True)
class DrafterSpec:
    kind: DrafterKind
    help: str  # for the command line
    needs_model: bool  # drafts with a draft model (without one it cannot draft)
    sources: tuple[Source, ...]  # who may propose a step's drafts
    build: Callable[[Model, DraftSettings], Drafter]  # the draft model is None unless needs_model

    @property
    def mixed(self) -> bool:
        """Its steps come from more than one source (each gets its own K policy)."""
        return len(self.sources) > 1


def _model(draft: Model, settings: DraftSettings, guess: Guess | None = None) -> Drafter:
    """The draft model's drafter: through text when it has another vocabulary (`settings.cross`), by
    shared tokens or by its own text re-encoded (`cross.mode`). Of the verifier's vocabulary, it reads
    `guess`'s tokens ahead (model_drafter.py)."""
    cross = settings.cross
    if cross is not None and cross.mode == "string":
        if cross.verifier_text is None:
            raise UsageError("--cross-mode string needs the verifier's tokenizer (drafts/cross_vocab.py gives it)")
        return StringDrafter(draft, cross, cross.verifier_text, p_min=settings.p_min, n_min=settings.n_min)
    if settings.cross is not None:
        return CrossVocabDrafter(draft, settings.cross, p_min=settings.p_min, n_min=settings.n_min)
    return ModelDrafter(draft, p_min=settings.p_min, n_min=settings.n_min, guess=guess)


def _ngram(draft: Model, settings: DraftSettings) -> Drafter:
    return NgramDrafter(session=settings.session)


def _hybrid(draft: Model, settings: DraftSettings) -> Drafter:
    # Matches of 2 tokens and more, where their evidence makes the first draft at least an even bet; the
    # draft model reads the lookup's weaker guesses ahead.
    ngram = NgramDrafter(session=settings.session)
    return HybridDrafter(_model(draft, settings, ngram.guess), ngram, min_match=2, min_chance=0.5)


def _cross(draft: Model, settings: DraftSettings) -> Drafter:
    if settings.cross is None:
        raise UsageError("--drafter cross needs the pair's vocabulary map (a draft of another vocabulary)")
    return _model(draft, settings)


DRAFTER_KINDS: dict[DrafterKind, DrafterSpec] = {
    spec.kind: spec
    for spec in (
        DrafterSpec("hybrid", "n-gram drafts on long matches, else the draft model", True, ("model", "ngram"), _hybrid),
        DrafterSpec("model", "the draft model only", True, ("model",), _model),
        DrafterSpec("ngram", "prompt lookup and the session n-gram cache, no draft model", False, ("ngram",), _ngram),
        DrafterSpec(
            "cross",
            "a draft model of another vocabulary, reading the text, proposing shared tokens or its own text "
            "re-encoded by the verifier (--cross-mode)",
            True,
            ("model",),
            _cross,
        ),
    )
}
assert set(DRAFTER_KINDS) == set(get_args(DrafterKind)), "every kind has its row"
DEFAULT_DRAFTER: DrafterKind = "hybrid"

# Who may propose a step's drafts, in the stats' words. Every kind drafts from FORCED too when the
# answer follows a grammar (core/forced_drafter.py): those steps need no K policy of their own.
FORCED: Source = "grammar"
SOURCES: dict[Source, str] = {
    "model": "the draft model",
    "ngram": "prompt lookup and the session n-gram cache",
    FORCED: "the tokens a grammar forces (structured output, tool calls)",
}
assert set(SOURCES) == set(get_args(Source)), "every source has its row"


def drafter_kind(text: str, option: str = "--drafter") -> DrafterKind:
    """A kind as the user typed it, or UsageError naming the choices."""
    for kind in DRAFTER_KINDS:
        if kind == text:
            return kind
    raise UsageError(f"{option} must be one of {', '.join(DRAFTER_KINDS)}, not {text!r}")


def cross_mode_named(text: str, option: str = "--cross-mode") -> CrossModeChoice:
    """A cross-vocabulary mode (or "auto") as the user typed it, or UsageError naming the choices."""
    for mode in CROSS_MODE_CHOICES:
        if mode == text:
            return mode
    raise UsageError(f"{option} must be one of {', '.join(CROSS_MODE_CHOICES)}, not {text!r}")


def build_drafter(
    kind: DrafterKind, draft_model: Model | None, settings: DraftSettings = DraftSettings()
) -> Drafter | None:
    """The drafter of this kind; None when it needs a draft model and there is none."""
    spec = DRAFTER_KINDS[kind]
    if spec.needs_model and draft_model is None:
        return None
    return spec.build(draft_model, settings)  # type: ignore[arg-type]  # a kind without a model ignores it


class HybridDrafter:
    """The n-gram proposal when its match is at least `min_match` tokens long and its first draft's
    evidence gives it at least `min_chance` (ngram_drafter.Match.evidence), else the model: a weak
    repeat of the answer's own words is no reason to leave out a draft model that would draft there.
    Each step's `Drafts.source` says which; `kpolicy.PerSource` keeps a K policy for each."""

    source: Source = "model"

    def __init__(self, model_drafter: Drafter, ngram: NgramDrafter, *, min_match: int = 3, min_chance: float = 0.0):
        self.model_drafter, self.ngram = model_drafter, ngram
        self.min_match, self.min_chance = min_match, min_chance
        # A step asks `next_source`, then `propose`, on the same context: one lookup (up to K_MAX
        # tokens, cut to the step's K) serves both. The key: the context's length and last tokens.
        self._last: tuple[tuple[int, ...], int, Match] | None = None  # (key, its k, the match)

    def prepare(self, prompt_tokens: Sequence[int]) -> None:
        self._last = None
        self.model_drafter.prepare(prompt_tokens)
        self.ngram.prepare(prompt_tokens)

    def room(self, context_length: int) -> int:
        return self.model_drafter.room(context_length)

    def unread(self, context: list[int]) -> int:
        return self.model_drafter.unread(context)

    def next_source(self, context: list[int]) -> Source:
        return self.ngram.source if self._takes(self._lookup(context, 1)) else self.model_drafter.source

    def _lookup(self, context: list[int], k: int) -> Match:
        key = (len(context), *context[-self.ngram.max_ngram :])
        if self._last is None or self._last[0] != key or self._last[1] < k:
            self._last = (key, max(k, K_MAX), self.ngram.lookup(context, max(k, K_MAX)))
        match = self._last[2]
        return dataclasses.replace(match, tokens=match.tokens[:k])

    def _takes(self, match: Match) -> bool:
        return bool(match.tokens) and match.length >= self.min_match and match.evidence()[0] >= self.min_chance

    def propose(
        self,
        context: list[int],
        k: int,
        step: DraftStep,
    ) -> Drafts:
        # The same test as `next_source`, on the same lookup.
        match = self._lookup(context, k)
        if self._takes(match):
            return self.ngram.drafts(match, step)
        return self.model_drafter.propose(context, k, step)

    def sync(self, context: list[int]) -> None:
        self.model_drafter.sync(context)
        self.ngram.sync(context)
