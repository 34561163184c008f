"""tuning.json: what this machine measured, kept per machine (`$XDG_CONFIG_HOME/specgguf/tuning.json`).

- The best fixed K `specgguf bench` measured for a pair (`stored_measurement`, a `BenchResult`),
  which `-k auto` uses (kchoice.make_policy).
- Measured costs per model file and settings (`stored_seconds`): the verifier's verify cost by
  batch size and the draft's cost per token, which adaptive K starts from: `probe` gives the
  stored ones, or measures them once now (core/costs.py's `measure`) and keeps them; a run long
  enough to learn them from its steps keeps what it learned instead (`keep_learned`).
- The draft variants `--draft-variant auto` measured for a draft and verifier, and its choice
  (`stored_draft_variant`, a `MeasuredVariants`: drafts/made.py); a found draft of another
  vocabulary measured against n-gram drafts alone (drafts/cross_search.py's `Trial`, read through `stored_entry`).

Entries come back as those typed values, checked on read by one reader (`read_entry`, given the kind's
`from_json`): a cost table has the entries its kind needs (`_COST_ENTRIES`), each between 1 µs and an
hour, and a verify table is no costlier than its single passes (`costs.disturbed`: one measured on a
busy machine is measured again). The file itself (read only when a small regular file, changed under
its lock) is files/tuning_file.py's.

A damaged file is never fatal: each problem is one warning and the entry is ignored; a file
that cannot be parsed is kept as tuning.json.damaged when it is next written.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from .core.costs import PROBE_BATCH, PROBE_CONTEXT, MachineCosts, disturbed, measure, measure_read
from .errors import UsageError
from .files.tuning_file import load_tuning, machine_entries, machine_id, tuning_path, update_tuning, warn
from .llama import huge_pages
from .llama.loaded import LoadedModel
from .llama.variants import Variant, parse_variant

Entry = TypeVar("Entry")  # a stored entry's typed value (BenchResult, MeasuredVariants, cross_search.Trial)


def pair_key(verifier: Path, draft: Path) -> str:
    return f"{Path(verifier).name}|{Path(draft).name}"


class InvalidEntry(ValueError):
    """What is wrong with a stored entry (a warning, and the entry is ignored)."""


def _number(value: object) -> TypeGuard[float]:
    """A finite JSON number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class BenchResult:
    """The best fixed K `bench` measured for a pair here at one temperature (k 0: plain decoding was faster)."""

    k: int
    speedup: float
    acceptance_rate: float | None = None

    @classmethod
    def from_json(cls, value: object) -> BenchResult:
        if not isinstance(value, dict):
            raise InvalidEntry(f"expected an object, got {type(value).__name__}")
        k, speedup, acceptance = value.get("k"), value.get("speedup"), value.get("acceptance_rate")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 64:
            raise InvalidEntry(f"'k' must be a whole number from 0 to 64, got {k!r}")
        if not (_number(speedup) and speedup > 0):
            raise InvalidEntry(f"'speedup' must be a positive number, got {speedup!r}")
        if acceptance is not None and not (_number(acceptance) and 0 <= acceptance <= 1):
            raise InvalidEntry(f"'acceptance_rate' must be between 0 and 1, got {acceptance!r}")
        return cls(k, float(speedup), None if acceptance is None else float(acceptance))

    def as_json(self) -> dict:
        return {"k": self.k, "speedup": self.speedup, "acceptance_rate": self.acceptance_rate}


def stored_measurement(verifier: Path, draft: Path, temperature: float) -> BenchResult | None:
    """The best K `bench` stored for this pair here, if the entry is valid (else a warning and None)."""
    key, kind = pair_key(verifier, draft), "greedy" if temperature <= 0 else "sampled"
    entry = machine_entries().get(key, {})
    if not isinstance(entry, dict):
        warn(f"the entry for {key} is not an object")
        return None
    return read_entry(entry.get(kind), BenchResult.from_json, where=f"the {kind} entry for {key}")


def store_measurement(verifier: Path, draft: Path, temperature: float, measurement: BenchResult) -> None:
    """Record a bench result for `-k auto` (the pair's other entries are kept)."""

    def update(data: dict) -> None:
        pairs = data.setdefault(machine_id(), {})
        if not isinstance(pairs.get(pair_key(verifier, draft)), dict):
            pairs[pair_key(verifier, draft)] = {}
        pairs[pair_key(verifier, draft)]["greedy" if temperature <= 0 else "sampled"] = measurement.as_json()

    update_tuning(update)


HUGE_PAGES_KEY = "|huge_pages"  # how a key measured with huge pages ends (`model_key`)


def model_key(kind: str, model: Path, *, n_threads: int, n_gpu_layers: int) -> str:
    """Costs measured for this file (name and size) run with these settings (costs.py), and with huge
    pages where this process has them (llama/huge_pages.py: a pass 10-20% faster, another table)."""
    try:
        size = Path(model).stat().st_size
    except OSError:
        size = 0
    pages = HUGE_PAGES_KEY if huge_pages.in_use() else ""
    return f"{kind}|{Path(model).name}|{size}|threads={n_threads}|gpu_layers={n_gpu_layers}{pages}"


# How many costs a stored list holds, by its key's kind (`model_key`): a verify table has a row per
# batch size from 1 (core/costs.py's MachineCosts needs two or more), a draft one token's cost.
_COST_ENTRIES = {"verify_costs": (2, 1024), "draft_costs": (1, 1), "draft_read": (1, 1)}
MIN_SECONDS, MAX_SECONDS = 1e-6, 3600.0  # what a plausible cost is: from a microsecond to an hour


def seconds_reader(key: str) -> Callable[[object], list[float]]:
    """What reads the costs stored under `key`: as many as its kind needs, each a plausible cost."""
    fewest, most = _COST_ENTRIES.get(key.split("|", 1)[0], (1, 1024))

    def read(costs: object) -> list[float]:
        if (
            isinstance(costs, list)
            and fewest <= len(costs) <= most
            and all(_number(cost) and MIN_SECONDS <= cost <= MAX_SECONDS for cost in costs)
        ):
            costs = [float(cost) for cost in costs]
            if key.startswith("verify_costs|") and (n := disturbed(costs)):
                raise InvalidEntry(
                    f"a batch of {n} tokens at {costs[n - 1] / costs[0]:.1f}× one token's cost, more than"
                    f" {n} passes of one would take (measured while the machine was busy)"
                )
            return costs
        count = f"{fewest}" if fewest == most else f"{fewest} to {most}"
        raise InvalidEntry(f"expected a list of {count} costs, each from 1 µs to 1 h (in seconds)")

    return read


def stored_seconds(key: str) -> list[float] | None:
    """Measured seconds stored under `key` (a verify table, a draft token's cost), if valid."""
    return stored_entry(key, seconds_reader(key))


def store_seconds(key: str, costs: list[float]) -> None:
    """Keep `costs` under `key`; never what `stored_seconds` would refuse to read back (InvalidEntry): a
    cost out of range, a verify table with a busy machine's shape."""
    seconds_reader(key)(costs)

    def update(data: dict) -> None:
        data.setdefault(machine_id(), {})[key] = [round(c, 6) for c in costs]

    update_tuning(update)


def draft_variant_key(draft: Path, verifier: LoadedModel, kind: str = "draft_variant") -> str:
    """The draft made for this machine (or a found draft's trial, `kind`) is measured against one
    verifier, with its thread count."""
    return (
        model_key(kind, draft, n_threads=verifier.n_threads, n_gpu_layers=0)
        + "|"
        + model_key("verifier", verifier.path, n_threads=verifier.n_threads, n_gpu_layers=verifier.n_gpu_layers)
    )


_CANDIDATE_FIELDS = {"name": str, "ms_per_token": float, "acceptance": float, "expected_tokens_per_second": float}
_MEASURES = ("ms_per_token", "acceptance", "expected_tokens_per_second")  # a Candidate's fields after its variant


@dataclass(frozen=True)
class Candidate:
    """A draft variant as measured here against a verifier."""

    variant: Variant
    ms_per_token: float
    acceptance: float  # per position, given the earlier ones accepted
    expected_tokens_per_second: float

    def describe(self) -> str:
        return (
            f"{self.variant}: {self.ms_per_token:.1f} ms/token, acceptance {self.acceptance:.2f}"
            f" → {self.expected_tokens_per_second:.1f} tok/s expected at its best K"
        )

    def as_json(self) -> dict:
        return {"name": self.variant.name} | {field: getattr(self, field) for field in _MEASURES}


@dataclass(frozen=True)
class MeasuredVariants:
    """What `--draft-variant auto` measured here for one draft and verifier: every candidate, and the choice."""

    choice: Variant
    candidates: tuple[Candidate, ...]

    @property
    def best(self) -> Candidate:
        return next(candidate for candidate in self.candidates if candidate.variant == self.choice)

    @classmethod
    def from_json(cls, value: object) -> MeasuredVariants:
        if not isinstance(value, dict) or not isinstance(value.get("candidates"), list) or not value["candidates"]:
            raise InvalidEntry("expected an object with a list of candidates")
        for candidate in value["candidates"]:
            if not isinstance(candidate, dict) or set(candidate) != set(_CANDIDATE_FIELDS):
                raise InvalidEntry(f"a candidate must have exactly {', '.join(_CANDIDATE_FIELDS)}")
            for field, kind in _CANDIDATE_FIELDS.items():
                number = kind is float and _number(candidate[field])
                if not (isinstance(candidate[field], str) if kind is str else number and candidate[field] >= 0):
                    raise InvalidEntry(f"candidate field {field!r} is {candidate[field]!r}")
            if candidate["acceptance"] > 1:  # a chance: it prices a draft's reading (AdaptiveK.speedup)
                raise InvalidEntry(f"candidate field 'acceptance' is {candidate['acceptance']!r}")
        names = [candidate["name"] for candidate in value["candidates"]]
        try:
            variants = {name: parse_variant(name) for name in names}
        except UsageError:
            variants = {}
        if value.get("choice") not in variants:
            raise InvalidEntry(f"unknown variant in {value.get('choice')!r} / {names}")
        candidates = tuple(
            Candidate(variants[entry["name"]], *(float(entry[field]) for field in _MEASURES))
            for entry in value["candidates"]
        )
        return cls(variants[value["choice"]], candidates)

    def as_json(self) -> dict:
        return {"choice": self.choice.name, "candidates": [candidate.as_json() for candidate in self.candidates]}


# --- the one reader of an entry: raw JSON in, its typed value out (each kind's `from_json` checks it) ---
def read_entry(value: object, read: Callable[[object], Entry], *, where: str) -> Entry | None:
    """`value` read into its typed value by `read` (a `from_json`); None where it is absent, and where it
    is invalid (then one warning names `where` and the problem)."""
    if value is None:
        return None
    try:
        return read(value)
    except InvalidEntry as problem:
        warn(f"{where}: {problem}")
        return None


def stored_entry(key: str, read: Callable[[object], Entry]) -> Entry | None:
    """The entry stored here under `key`, read by `read` (read_entry), if valid."""
    return read_entry(machine_entries().get(key), read, where=key)


def stored_at_any_threads(
    kind: str, draft: Path, verifier: Path, read: Callable[[object], Entry]
) -> list[tuple[str, Entry]]:
    """Every valid entry of `kind` stored here for this draft file and verifier file, at any thread count,
    measured with huge pages where this process has them and without where it has not (`model_key`: the
    other's entries priced other passes): (threads, the entry read by `read`). An invalid one is left out
    quietly: this is a look ahead, and the run that reads its own entry warns of it."""
    head = model_key(kind, draft, n_threads=0, n_gpu_layers=0).split("|threads=")[0] + "|threads="
    verifier_part = model_key("verifier", verifier, n_threads=0, n_gpu_layers=0).split("|threads=")[0] + "|threads="
    paged = huge_pages.in_use()
    found = []
    for key, value in machine_entries().items():
        if key.startswith(head) and verifier_part in key and key.endswith(HUGE_PAGES_KEY) == paged:
            with contextlib.suppress(InvalidEntry):
                found.append((key[len(head) :].split("|", 1)[0], read(value)))
    return found


def stored_draft_variant(key: str) -> MeasuredVariants | None:
    """The draft variants measured here for this draft and verifier, if the entry is valid."""
    return stored_entry(key, MeasuredVariants.from_json)


def stored_draft_variants(draft: Path, verifier: Path) -> list[tuple[str, MeasuredVariants]]:
    """Every valid choice stored here for this draft file and verifier file: (threads, entry)."""
    return stored_at_any_threads("draft_variant", draft, verifier, MeasuredVariants.from_json)


def keep_entry(key: str, value: dict) -> None:
    """Store a measurement; an unwritable config folder costs a warning (measured again next time)."""

    def update(data: dict) -> None:
        data.setdefault(machine_id(), {})[key] = value

    try:
        update_tuning(update)
    except OSError as error:
        sys.stderr.write(
            f"specgguf: warning: could not keep the draft's measurement ({error}); measuring again next time\n"
        )


def keep_draft_variant(key: str, measured: MeasuredVariants) -> None:
    """Store what was measured (keep_entry)."""
    keep_entry(key, measured.as_json())


# --- this machine's costs for a pair, measured once and kept ---
def key_for(model: LoadedModel, kind: str = "verify_costs") -> str:
    key = model_key(kind, model.path, n_threads=model.n_threads, n_gpu_layers=model.n_gpu_layers)
    workers = getattr(getattr(model, "placement", None), "workers", ())
    return key + (f"|rpc={','.join(workers)}" if workers else "")  # costs over a network are their own


def stored(model: LoadedModel) -> list[float] | None:
    """The verify table stored for this verifier file and settings on this machine, if any."""
    return stored_seconds(key_for(model))


PROBE_TRIES = 3  # probes of the verify table, while each finds the machine busy


def measure_verify(model: LoadedModel, *, max_batch: int, **options: Any) -> list[float]:
    """The verify table (`costs.measure`'s `options`), measured again while its shape says the machine
    was busy (`costs.disturbed`), up to `PROBE_TRIES` times: each size's fastest of every try (a busy
    machine slows a pass, never speeds one up). A table still disturbed is returned; no store keeps it."""
    verify: list[float] = []
    for _ in range(PROBE_TRIES):
        tried = measure(model, max_batch=max_batch, **options)
        verify = [min(pair) for pair in zip(verify, tried, strict=True)] if verify else tried
        if not disturbed(verify):
            break
    return verify


def probe(
    verifier: LoadedModel, draft: LoadedModel | None = None, *, on_measure: Callable[[], None] | None = None
) -> MachineCosts:
    """This machine's costs for the pair: stored ones, else measured now (calling `on_measure`
    first, to say so) and stored. A config folder that cannot be written costs a warning."""
    verify = stored(verifier)
    draft_cost = stored_seconds(key_for(draft, "draft_costs")) if draft is not None else [0.0]
    draft_read = stored_seconds(key_for(draft, "draft_read")) if draft is not None else [0.0]
    if (verify is None or draft_cost is None or draft_read is None) and on_measure is not None:
        on_measure()
    if verify is None:
        verify = _probe_verify(verifier)
    if draft_cost is None:
        assert draft is not None  # no draft costs [0.0]
        draft_cost = [measure_draft(draft, store=True)]
    if draft_read is None:
        assert draft is not None  # no draft reads [0.0]
        draft_read = [_measure_read(draft)]
    return MachineCosts(tuple(verify), draft_cost[0], draft_read[0])


def read_cost(draft: LoadedModel, *, on_measure: Callable[[], None] | None = None) -> float:
    """Seconds a token the draft model takes to read a long context in one batch (core/drafting.py
    prices a draft's catch-up with it): stored, else measured now and kept. A fixed K asks for it alone,
    without the verify table it does not use."""
    stored_read = stored_seconds(key_for(draft, "draft_read"))
    if stored_read is not None:
        return stored_read[0]
    if on_measure is not None:
        on_measure()
    return _measure_read(draft)


def _measure_read(draft: LoadedModel) -> float:
    """The draft's reading a token, measured now and kept (where tuning.json can keep it)."""
    return _keep(key_for(draft, "draft_read"), [measure_read(draft)])[0]


def store_measured(key: str, costs: list[float]) -> None:
    """`bench`'s costs kept under `key`, unless they are ones `store_seconds` refuses (a warning; a run
    then probes its own)."""
    try:
        store_seconds(key, costs)
    except InvalidEntry as problem:
        what = key.split("|", 1)[0].replace("_", " ")  # "verify costs", "draft costs"
        sys.stderr.write(f"specgguf: warning: not keeping the {what}: {problem}\n")


def _probe_verify(verifier: LoadedModel) -> list[float]:
    """The verify table, kept: the fastest of a few rounds (a short probe is easily disturbed, never sped
    up), probed again while the machine was busy (`measure_verify`); a table still disturbed serves this
    run and is not kept (`store_seconds` refuses it)."""
    table = measure_verify(verifier, max_batch=PROBE_BATCH, repeats=2, context=PROBE_CONTEXT, statistic=min)
    return _keep(key_for(verifier), table)


def keep_learned(verifier: LoadedModel, draft: LoadedModel | None, learned: MachineCosts) -> None:
    """What a run's steps taught (core/costs.py's StepCosts.learned) replaces the stored costs: the
    next run's prior. A probe on a busy machine is not kept for good (nor a learned table with the shape
    of one: `store_seconds` refuses it)."""
    _keep(key_for(verifier), list(learned.verify))
    if draft is not None:
        _keep(key_for(draft, "draft_costs"), [learned.draft])


def measure_draft(draft: LoadedModel, *, store: bool) -> float:
    """Seconds for the draft model to propose one token (a batch of one, its logits read)."""
    (seconds,) = measure(draft, max_batch=1, repeats=5, context=PROBE_CONTEXT, statistic=min)
    return _keep(key_for(draft, "draft_costs"), [seconds])[0] if store else seconds


def _keep(key: str, seconds: list[float]) -> list[float]:
    """`seconds`, kept under `key` where they can be (not in a damaged or unwritable tuning.json, nor where
    `store_seconds` refuses them: they serve this run only)."""
    seconds = [round(c, 6) for c in seconds]  # as tuning.json keeps them: the same costs next time
    if load_tuning() is None:  # damaged or unreadable: only `bench` replaces it (keeping a .damaged copy)
        sys.stderr.write(
            f"specgguf: warning: not keeping the measured costs: {tuning_path()} is unusable (see above)\n"
        )
        return seconds
    try:
        store_seconds(key, seconds)
    except InvalidEntry:
        pass
    except OSError as error:
        sys.stderr.write(f"specgguf: warning: could not keep the measured costs ({error}); measuring again next time\n")
    return seconds
