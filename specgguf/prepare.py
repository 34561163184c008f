"""The one set-up path every command shares: load the pair, know its costs, build drafter and K policy.

`prepare` loads the verifier and draft (refusing pairs llama.cpp would refuse) and
gets this machine's costs for them (tuning.probe: stored, or measured once now).
`Prepared.drafter` and `Prepared.policy` then give the drafter and K policy for an answer; `run`,
`chat` (whose /k changes K between turns), `bench` and `serve` (per request) ask it. At the end,
`Prepared.keep_learned_costs` keeps what an adaptive policy learned of the costs (tuning.json).
Where K comes from (`-k`, what `bench` stored, adaptive K) is kchoice.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from .core.constraint import Constraint
from .core.costs import MachineCosts
from .core.cross_drafter import (
    AUTO_CROSS_MODE,
    CROSS_MODES,
    DEFAULT_CROSS_MODE,
    CrossMode,
    CrossModeChoice,
    CrossVocab,
    unmeasured_mode,
)
from .core.drafters import DEFAULT_DRAFTER, DRAFTER_KINDS, DrafterKind, DraftSettings, build_drafter
from .core.drafting import Drafter
from .core.engine import KPolicy, speculate
from .core.events import Generation
from .core.kpolicy import PolicyConfig
from .core.model import Model
from .core.ngram_cache import SessionNgrams
from .core.sampling import SamplingSettings
from .drafts.cross_search import Measure, ModeChoice, choose_mode
from .drafts.cross_vocab import cross_vocab, shared_text
from .drafts.made import DraftChoice, load_chosen
from .errors import UsageError
from .files.assets import cache_dir
from .files.resolve import ResolvedPair
from .kchoice import KChoice, KSource, make_policy
from .llama.compat import ensure_compatible, vocabularies_match
from .llama.loaded import LoadedModel, ModelSettings
from .llama.rpc import DEFAULT_TIMEOUT, RpcWorker
from .llama.variants import AUTO, ORIGINAL_VARIANT, Auto, Variant
from .tuning import keep_learned, probe, read_cost

MEASURING = "measuring this machine's costs for the pair (once; kept in tuning.json)"


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    rpc: tuple[RpcWorker, ...] = ()  # the verifier's layers go to these workers
    rpc_draft: bool = False  # ... and the draft's too
    rpc_timeout: float = DEFAULT_TIMEOUT
    draft_variant: Variant | Auto = AUTO  # the draft made for this machine (drafts/made.py), or a variant

    @property
    def verifier_settings(self) -> ModelSettings:
        return ModelSettings(self.n_ctx, self.n_threads, self.n_gpu_layers, self.rpc, self.rpc_timeout)

    @property
    def draft_settings(self) -> ModelSettings:
        """The draft's own GPU layers, on the RPC workers only with --rpc-draft (the original, and
        whichever variant --draft-variant chooses)."""
        workers = self.rpc if self.rpc_draft else ()
        return ModelSettings(self.n_ctx, self.n_threads, self.n_gpu_layers_draft, workers, self.rpc_timeout)


@dataclass(frozen=True)
class DraftOptions:
    k: KChoice = field(default_factory=lambda: KChoice("auto"))
    drafter: DrafterKind = DEFAULT_DRAFTER  # drafters.DRAFTER_KINDS says what each kind does
    p_min: float = 0.0  # early stop: the draft stops below this top probability
    n_min: int = 0  # ... but only after this many drafts
    force_spec: bool = False  # never fall back to plain decoding
    keep_ngrams: bool = False  # the session n-gram cache persists per verifier (read at start, saved at the end)
    trees: bool = False  # draft trees: the runner-up beside the chain where the costs say it pays
    # The draft was found here, of another vocabulary (drafts/cross_search.py): adopted only where measured
    # (once, kept in tuning.json) to beat n-gram drafts alone; else the run drafts with n-grams alone.
    trial: bool = False
    # A draft of another vocabulary proposes shared tokens ("tokens") or its own text re-encoded by the
    # verifier's tokenizer ("string": core/string_drafter.py); "auto": whichever measured faster here.
    cross_mode: CrossModeChoice = AUTO_CROSS_MODE

    @property
    def plain(self) -> bool:
        return self.k.mode == "fixed" and self.k.k == 0


@dataclass
class Prepared:
    """A loaded pair and this machine's costs for it: what every command generates with."""

    resolved: ResolvedPair
    verifier: LoadedModel
    draft: LoadedModel | None
    options: DraftOptions
    load: LoadOptions = field(default_factory=LoadOptions)  # how the pair was loaded
    draft_choice: DraftChoice | None = None  # which draft file loaded, and why
    on_measure: Callable[[], None] | None = None  # called before costs are measured (to say so)
    _costs: MachineCosts | None = None
    _read: float | None = None  # the draft's reading a token, for a fixed K (`read_cost`)
    cross: CrossVocab | None = None  # a draft of another vocabulary: how it drafts through text (drafts/cross_vocab.py)
    # What followed each n-gram in everything this session read and generated (the n-gram and
    # hybrid drafters draft from it); with --keep-ngrams, also what earlier sessions saw.
    ngrams: SessionNgrams = field(default_factory=SessionNgrams)

    @property
    def costs(self) -> MachineCosts:
        """This machine's costs for the pair (tuning.probe): stored, or measured on first need."""
        if self._costs is None:
            self._costs = probe(self.verifier, self.draft, on_measure=self.on_measure)
        return self._costs

    def read_cost(self) -> float | None:
        """Seconds a token the draft model takes to read a long context (None: no draft): as the costs
        measured it, else measured alone (tuning.read_cost: a fixed K needs no verify table). A fixed K
        prices its draft's catch-up with it: priced from the prompt's pass instead, a prompt the
        verifier's cache held (one token read in a whole pass) made the catch-up look 10-30 times dearer
        than it is, and the draft waited out whole answers without drafting."""
        if self.draft is None:
            return None
        if self._costs is not None and self._costs.draft_read > 0:
            return self._costs.draft_read
        if self._read is None:
            self._read = read_cost(self.draft, on_measure=self.on_measure)
        return self._read

    def drafter(
        self,
        kind: DrafterKind | None = None,
        *,
        p_min: float | None = None,
        session: SessionNgrams | None = None,
        draft: Model | None = None,
    ) -> Drafter | None:
        """The proposer for an answer (None: nothing to draft with). Its n-grams are the
        session's unless `session` gives others (bench: a new one per run); it drafts with the
        draft model unless `draft` gives another view of it (serve --parallel: a live sequence's)."""
        settings = DraftSettings(
            p_min=self.options.p_min if p_min is None else p_min,
            n_min=self.options.n_min,
            session=self.ngrams if session is None else session,
            cross=self.cross,
        )
        return build_drafter(kind or self.options.drafter, self.draft if draft is None else draft, settings)

    def generate(
        self,
        prompt_tokens: list[int],
        *,
        drafter: Drafter | None,
        policy: KPolicy,
        max_tokens: int,
        settings: SamplingSettings,
        seed: int,
        constraint: Constraint | None = None,
        verifier: Model | None = None,
    ) -> Generation:
        """One answer from the engine over the loaded pair, driven and timed (core.events.Generation);
        `constraint`: a grammar the answer follows (grammar.constraint_for); `verifier`: another view
        of the verifier (serve --parallel: a live sequence's)."""
        events = speculate(
            verifier=self.verifier if verifier is None else verifier,
            drafter=drafter,
            prompt_tokens=prompt_tokens,
            k=policy,
            max_tokens=max_tokens,
            settings=settings,
            rng=np.random.default_rng(seed),
            constraint=constraint,
        )
        return Generation(events)

    def keep_learned_costs(self, policy: KPolicy) -> MachineCosts | None:
        """What an adaptive policy's steps taught about this machine's costs, once enough steps ran
        (else None): the prior for this session's next answers and, in tuning.json, the next run's."""
        learned = policy.learned_costs()
        if learned is not None:
            self._costs = learned
            keep_learned(self.verifier, self.draft, learned)
        return learned

    def save_ngrams(self) -> Path | None:
        """With --keep-ngrams, write the session's n-gram cache back (atomically); where it went."""
        if not self.options.keep_ngrams:
            return None
        path, key = ngram_file(self.resolved.verifier, self.verifier.n_vocab)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ngrams.save(path, key=key)
        return path

    def policy(
        self,
        choice: KChoice | None = None,
        *,
        temperature: float,
        drafter: DrafterKind | None = None,
        config: PolicyConfig | None = None,
    ) -> tuple[KPolicy, KSource]:
        """The K policy for an answer: the command's -k unless `choice` (chat's /k, a request) says otherwise."""
        kind = drafter or self.options.drafter
        return make_policy(
            choice or self.options.k,
            costs=lambda: self.costs,
            read=self.read_cost,
            verifier=self.resolved.verifier,
            draft=self.resolved.draft if self.draft is not None else None,
            drafter=kind,
            temperature=temperature,
            recommended_k=self.resolved.recommended_k,
            force_spec=self.options.force_spec,
            trees=self.options.trees,
            config=config,
            measured_acceptance=self.measured_acceptance,
        )

    @property
    def measured_acceptance(self) -> float | None:
        """The loaded draft's acceptance as measured here against this verifier (drafts/made.py), where
        its choice measured it (None: not measured, or another vocabulary's)."""
        choice = self.draft_choice
        if self.draft is None or choice is None or choice.cross:
            return None
        return next((c.acceptance for c in choice.candidates if c.variant == choice.variant), None)


CROSS_WHY = "another vocabulary: it drafts through the text"


def load_models(
    resolved: ResolvedPair,
    options: LoadOptions,
    *,
    need_draft: bool,
    announce: Callable[[str], None] | None = None,
    cross_ok: bool = False,
) -> tuple[LoadedModel, LoadedModel | None, DraftChoice | None]:
    """Load the verifier and (if drafting) the draft, refusing pairs llama.cpp would refuse unless
    `cross_ok`: then a draft of another vocabulary is used as given (it drafts through text). The draft
    is the one made for this machine unless --draft-variant says otherwise (drafts/made.py)."""
    verifier = options.verifier_settings.load(resolved.verifier)
    if not need_draft or resolved.draft is None:
        return verifier, None, None
    original = options.draft_settings.load(resolved.draft)  # it must pair before anything is derived from it
    if cross_ok and not vocabularies_match(verifier.vocab_info(), original.vocab_info()):
        if options.draft_variant not in (AUTO, ORIGINAL_VARIANT):
            raise UsageError(f"--draft-variant {options.draft_variant}: a draft of another vocabulary is used as given")
        return verifier, original, DraftChoice(ORIGINAL_VARIANT, resolved.draft, CROSS_WHY, cross=True)
    ensure_compatible(verifier.vocab_info(), original.vocab_info())
    if options.rpc and options.draft_variant == AUTO:
        return (
            verifier,
            original,
            DraftChoice(ORIGINAL_VARIANT, resolved.draft, "with --rpc the draft is used as given"),
        )
    draft, choice = load_chosen(
        verifier, original, options.draft_variant, settings=options.draft_settings, announce=announce
    )
    if draft is not original:
        original.close()
    return verifier, draft, choice


CROSS_MODE_WHY: dict[CrossMode, str] = {  # after CROSS_WHY (the first round's sentence, unchanged)
    "tokens": "",
    "string": " (string-level: its own text, re-encoded by the verifier)",
}


def pair_cross(
    verifier: LoadedModel, draft: LoadedModel | None, choice: DraftChoice | None, mode: CrossMode = DEFAULT_CROSS_MODE
) -> tuple[CrossVocab | None, DraftChoice | None]:
    """For a draft of another vocabulary (its choice says so: `cross`, set by load_models), what it drafts
    through text with (in `mode`), and its choice's reason with the overlap; else (None, choice). Every
    command's pair goes through here."""
    if draft is None or choice is None or not choice.cross:
        return None, choice
    cross = cross_vocab(draft, verifier, mode)
    return cross, in_mode(cross, choice, verifier.path)


def in_mode(cross: CrossVocab, choice: DraftChoice, verifier: Path) -> DraftChoice:
    """A cross-vocabulary draft's choice for the mode `cross` drafts in, its reason with the overlap."""
    why = f"{CROSS_WHY}{CROSS_MODE_WHY[cross.mode]}, {shared_text(cross.vocab_map, verifier)}"
    return replace(choice, why=why, cross_mode=cross.mode)


Verdict = Literal["draft", "decline", "asked"]  # what a measured draft of another vocabulary is for the run


def measured_cross(
    verifier: LoadedModel,
    draft: LoadedModel,
    cross: CrossVocab,
    choice: DraftChoice,
    drafting: DraftOptions,
    *,
    measure: Measure | None,
    announce: Callable[[str], None] | None,
) -> tuple[CrossVocab, DraftChoice, ModeChoice, Verdict]:
    """A draft of another vocabulary in the mode measured faster here for the pair (--cross-mode auto:
    both, once each, kept in tuning.json; else the one asked for), and the verdict: "draft" where that
    mode beats n-gram drafts alone and plain decoding, else "decline" for a found draft (`drafting.trial`)
    and "asked" for one given with -md (drafted with all the same); with each mode's trial."""
    modes = CROSS_MODES if drafting.cross_mode == AUTO_CROSS_MODE else (unmeasured_mode(drafting.cross_mode),)
    measured = choose_mode(verifier, draft, cross, modes, measure=measure, announce=announce)
    cross = replace(cross, mode=measured.mode)
    choice = in_mode(cross, choice, verifier.path)
    verdict: Verdict = "draft" if measured.trial.adopted else "decline" if drafting.trial else "asked"
    return cross, replace(choice, why=f"{choice.why}; measured here: {measured.describe()}"), measured, verdict


_VERDICTS: dict[Verdict, str] = {
    "draft": "drafting with it",
    "decline": "not drafting with it: n-gram drafts alone",
    "asked": "drafting with it as asked (n-gram drafts alone measured faster: --drafter ngram)",
}


def prepare(
    resolved: ResolvedPair,
    load: LoadOptions,
    drafting: DraftOptions,
    *,
    keep_draft: bool = False,
    on_measure: Callable[[], None] | None = None,
    on_announce: Callable[[str], None] | None = None,
    measure_now: bool = True,
    measure_trial: Measure | None = None,
) -> Prepared:
    """Load the pair and learn its costs here (now, unless `measure_now` is False: then on first
    need). The draft model loads unless nothing will draft with it (`--drafter ngram`, or `-k 0`
    unless `keep_draft`: chat's /k can turn drafting on later). `on_announce(text)` hears what is
    made once before loading (a draft for this machine); without it, `on_measure` is called.
    A found draft of another vocabulary (`drafting.trial`) is measured (`measure_trial`, else
    cross_search.measure_trial) unless kept, and dropped where n-gram drafts alone do better."""
    need_draft = DRAFTER_KINDS[drafting.drafter].needs_model and (keep_draft or not drafting.plain)
    announce = on_announce or (None if on_measure is None else lambda _text: on_measure())
    verifier, draft, choice = load_models(resolved, load, need_draft=need_draft, announce=announce, cross_ok=True)
    cross, choice = pair_cross(verifier, draft, choice, unmeasured_mode(drafting.cross_mode))
    if draft is not None and cross is not None and (drafting.trial or drafting.cross_mode == AUTO_CROSS_MODE):
        assert choice is not None
        cross, choice, measured, verdict = measured_cross(
            verifier, draft, cross, choice, drafting, measure=measure_trial, announce=announce
        )
        if on_announce is not None:
            on_announce(f"the draft of another vocabulary measured here: {measured.describe()}; {_VERDICTS[verdict]}")
        if verdict == "decline":
            draft.close()
            draft = cross = choice = None
            resolved, drafting = replace(resolved, draft=None), replace(drafting, drafter="ngram")
    prepared = Prepared(
        cross=cross,
        resolved=resolved,
        verifier=verifier,
        draft=draft,
        options=drafting,
        load=load,
        draft_choice=choice,
        on_measure=on_measure,
    )
    if drafting.keep_ngrams:
        path, key = ngram_file(resolved.verifier, verifier.n_vocab)
        if path.exists():
            prepared.ngrams = SessionNgrams.load(path, key=key, n_vocab=verifier.n_vocab)
    if measure_now and not drafting.plain:
        _ = prepared.costs  # measured now, before the first answer, if this machine has not yet
    return prepared


def ngram_file(verifier: Path, n_vocab: int) -> tuple[Path, str]:
    """Where a verifier's n-gram cache persists, and the key that ties the file to its tokenizer.
    The name is a digest of the key: nothing from the model's file name reaches the path."""
    size = verifier.stat().st_size if verifier.exists() else 0
    key = f"{verifier.name}|{size}|n_vocab={n_vocab}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_dir() / "ngrams" / f"{digest}.npz", key


def placement(verifier: LoadedModel, draft: LoadedModel | None) -> dict:
    """Where each model's layers are (for --json): workers, layer counts, and in words."""
    return {
        role: {**asdict(model.placement), "description": model.placement.describe(role)}
        for role, model in (("verifier", verifier), ("draft", draft))
        if model is not None and hasattr(model, "placement")
    }


def where_line(verifier: LoadedModel, draft: LoadedModel | None) -> str:
    """'verifier on 2 RPC workers · draft local', for the stats line."""
    return " · ".join(entry["description"] for entry in placement(verifier, draft).values())
