"""Where K comes from: `-k N`, `-k adaptive`, or `-k auto` (the default).

`auto` uses the best K that `specgguf bench` measured for this pair on this
machine (stored in `$XDG_CONFIG_HOME/specgguf/tuning.json`); if that measurement
says speculation is slower than plain decoding here, it decodes plain and says so
(`--force-spec` overrides). With no stored measurement it chooses K online
(`kpolicy.adaptive_policy`), which also falls back to plain when speculation is losing.
The stored K is the draft model's: the n-gram and hybrid drafters always choose K online.
`bench` also stores each verifier's verify cost by batch size (verify_costs.py) for them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .engine import FixedK, KPolicy
from .errors import UsageError
from .kpolicy import adaptive_policy

K_MAX = 16


@dataclass(frozen=True)
class KChoice:
    mode: str  # "auto", "adaptive" or "fixed"
    k: int | None = None


def parse_k(text: str | None) -> KChoice:
    if text is None or text == "auto":
        return KChoice("auto")
    if text == "adaptive":
        return KChoice("adaptive")
    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"-k/--draft-max takes a number, 'auto' or 'adaptive', not {text!r}") from None
    if not 0 <= k <= 64:
        raise UsageError(f"-k/--draft-max must be between 0 and 64, got {k}")
    return KChoice("fixed", k)


def machine_id() -> str:
    """What makes a measurement transferable: host, processor and core count."""
    return f"{platform.node()}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}"


def pair_key(verifier: Path, draft: Path) -> str:
    return f"{Path(verifier).name}|{Path(draft).name}"


def tuning_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "specgguf" / "tuning.json"


_warned: set[str] = set()


def _warn(problem: str) -> None:
    """One line on stderr, once per problem: a damaged tuning.json is ignored, never fatal."""
    if problem not in _warned and sys.stderr is not None:
        _warned.add(problem)
        sys.stderr.write(f"specgguf: warning: {tuning_path()}: {problem}; ignored (`specgguf bench` rewrites it)\n")


def load_tuning() -> dict | None:
    """tuning.json's contents; {} if there is none; None if it is there but not a JSON object."""
    try:
        text = tuning_path().read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        _warn(f"cannot be read ({error})")
        return None
    try:
        data = json.loads(text)
    except ValueError as error:
        _warn(f"not valid JSON ({error})")
        return None
    if not isinstance(data, dict):
        _warn("not a JSON object")
        return None
    return data


def _machine_entries() -> dict:
    entries = (load_tuning() or {}).get(machine_id(), {})
    if not isinstance(entries, dict):
        _warn("this machine's entry is not an object")
        return {}
    return entries


def _valid_measurement(value: object) -> str | None:
    """What is wrong with a stored bench result, or None."""
    if not isinstance(value, dict):
        return f"expected an object, got {type(value).__name__}"
    k, speedup = value.get("k"), value.get("speedup")
    if type(k) is not int or not 0 <= k <= 64:
        return f"'k' must be a whole number from 0 to 64, got {k!r}"
    if type(speedup) not in (int, float) or not math.isfinite(speedup) or speedup <= 0:
        return f"'speedup' must be a positive number, got {speedup!r}"
    acceptance = value.get("acceptance_rate")
    if acceptance is not None and (type(acceptance) not in (int, float) or not 0 <= acceptance <= 1):
        return f"'acceptance_rate' must be between 0 and 1, got {acceptance!r}"
    return None


def stored_measurement(verifier: Path, draft: Path, temperature: float) -> dict | None:
    """The best K `bench` stored for this pair here, if the entry is valid (else a warning and None)."""
    key, kind = pair_key(verifier, draft), "greedy" if temperature <= 0 else "sampled"
    entry = _machine_entries().get(key, {})
    if not isinstance(entry, dict):
        _warn(f"the entry for {key} is not an object")
        return None
    value = entry.get(kind)
    if value is None:
        return None
    if problem := _valid_measurement(value):
        _warn(f"the {kind} entry for {key}: {problem}")
        return None
    return value


def store_measurement(verifier: Path, draft: Path, temperature: float, measurement: dict) -> None:
    """Record a bench result for `-k auto` (the pair's other entries are kept)."""
    def update(data: dict) -> None:
        pairs = data.setdefault(machine_id(), {})
        if not isinstance(pairs.get(pair_key(verifier, draft)), dict):
            pairs[pair_key(verifier, draft)] = {}
        pairs[pair_key(verifier, draft)]["greedy" if temperature <= 0 else "sampled"] = measurement
    _update_tuning(update)


def verify_costs_key(verifier: Path, *, n_threads: int, n_gpu_layers: int) -> str:
    """A verify-cost profile holds for this file (name and size) run with these settings."""
    try:
        size = Path(verifier).stat().st_size
    except OSError:
        size = 0
    return f"verify_costs|{Path(verifier).name}|{size}|threads={n_threads}|gpu_layers={n_gpu_layers}"


def stored_verify_costs(key: str) -> list[float] | None:
    """Seconds to verify a batch of 1, 2, … tokens, as `bench` measured them here (see verify_costs.py)."""
    costs = _machine_entries().get(key)
    if costs is None:
        return None
    if isinstance(costs, list) and len(costs) >= 2 and all(
            type(c) in (int, float) and math.isfinite(c) and c > 0 for c in costs):
        return [float(c) for c in costs]
    _warn(f"{key}: expected a list of positive seconds")
    return None


def store_verify_costs(key: str, costs: list[float]) -> None:
    def update(data: dict) -> None:
        data.setdefault(machine_id(), {})[key] = [round(c, 6) for c in costs]
    _update_tuning(update)


def _update_tuning(update) -> None:
    """Read, change and write back tuning.json: to a temporary file, then renamed, so a crash
    never truncates it."""
    data, path = load_tuning(), tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is None:  # unreadable: keep it beside the new one rather than overwrite it
        os.replace(path, path.with_name(path.name + ".damaged"))
        sys.stderr.write(f"specgguf: warning: kept the damaged {path} as {path.name}.damaged\n")
        data = {}
    if not isinstance(data.get(machine_id(), {}), dict):
        data[machine_id()] = {}
    update(data)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(data, handle, indent=1)
    os.replace(handle.name, path)


def make_policy(choice: KChoice, *, verifier: Path, draft: Path | None, drafter: str, temperature: float,
                recommended_k: int | None, force_spec: bool,
                verify_profile: list[float] | None = None) -> tuple[KPolicy, str]:
    """The K policy for a run, and a few words on where K came from (for the stats line).
    `verify_profile`: the verifier's verify cost by batch size, if `bench` measured it here."""
    fallback_k = recommended_k or 8
    if draft is None and drafter != "ngram":
        return FixedK(0), "plain (no draft)"
    if choice.mode == "fixed":
        return FixedK(choice.k), f"K={choice.k} (-k)"
    adaptive = adaptive_policy(drafter, k_max=K_MAX, k_min=1 if force_spec else 0, verify_profile=verify_profile)
    costs = "verify costs from bench" if verify_profile else "no verify costs from bench yet"
    if choice.mode == "adaptive" or drafter != "model":
        # The stored best K is the draft model's alone: n-gram drafts (alone or in a hybrid) may
        # win where it measured plain faster, so they always choose K online.
        return adaptive, f"K adaptive ({costs})"
    stored = stored_measurement(verifier, draft, temperature)
    if stored is None:
        return adaptive, f"K adaptive (no bench stored for this pair here; {costs})"
    if stored["k"] == 0:
        if force_spec:
            return FixedK(fallback_k), f"K={fallback_k} (--force-spec; bench measured plain faster here)"
        return FixedK(0), (f"plain: bench measured speculation at {stored['speedup']:.2f}× here"
                           " (--force-spec to speculate)")
    return FixedK(stored["k"]), f"K={stored['k']} (bench here: {stored['speedup']:.2f}×)"
