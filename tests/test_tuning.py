"""Where K comes from: -k N, -k adaptive, -k auto with and without a stored bench result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specgguf import tuning
from specgguf.core.costs import LEARNED_MIN_STEPS, MachineCosts
from specgguf.core.engine import FixedK, StepEvent
from specgguf.core.kpolicy import AdaptiveK, PerSource
from specgguf.drafts.made import DraftChoice
from specgguf.errors import UsageError
from specgguf.kchoice import KChoice, make_policy, parse_k
from specgguf.llama.variants import parse_variant
from specgguf.prepare import DraftOptions, Prepared
from specgguf.tuning import BenchResult, Candidate, load_tuning, store_measurement, stored_measurement, tuning_path

VERIFIER, DRAFT = Path("/models/big.gguf"), Path("/models/small.gguf")
MEMORY_BOUND = MachineCosts((0.137, 0.141, 0.150, 0.189, 0.218), draft=0.030)  # F16 1.5B + Q4_K_M 0.5B here
COMPUTE_BOUND = MachineCosts((0.063, 0.098, 0.131, 0.160, 0.171), draft=0.033)  # Q4_K_M 1.5B + 0.5B here


pytestmark = pytest.mark.usefixtures("config_home")


def _policy(choice, **overrides):
    options = (
        dict(
            verifier=VERIFIER,
            draft=DRAFT,
            drafter="model",
            temperature=0.0,
            recommended_k=6,
            force_spec=False,
            costs=lambda: MEMORY_BOUND,
        )
        | overrides
    )
    return make_policy(choice, **options)


def test_parse_k():
    assert parse_k(None) == parse_k("auto") == KChoice("auto")
    assert parse_k("adaptive") == KChoice("adaptive") and parse_k("5") == KChoice("fixed", 5)
    for bad in ("five", "-1", "99"):
        with pytest.raises(UsageError):
            parse_k(bad)


def test_auto_without_a_measurement_is_adaptive_and_may_fall_back():
    policy, source = _policy(KChoice("auto"))
    assert isinstance(policy, AdaptiveK) and policy.config.k_min == 0 and source.adaptive and not source.decided
    policy, _ = _policy(KChoice("auto"), force_spec=True)
    assert policy.config.k_min == 1


def test_adaptive_says_before_the_first_step_when_the_draft_model_cannot_win_here():
    policy, source = _policy(KChoice("auto"), costs=lambda: COMPUTE_BOUND)
    assert isinstance(policy, AdaptiveK) and policy.choose() == 0 and source.decided
    assert str(source).endswith("(a draft token costs 33 ms, a verifier token 63 ms): plain decoding")
    _, hybrid = _policy(KChoice("adaptive"), costs=lambda: COMPUTE_BOUND, drafter="hybrid")
    assert hybrid.decided and str(hybrid).endswith("n-gram drafts only")
    _, forced = _policy(KChoice("auto"), costs=lambda: COMPUTE_BOUND, force_spec=True)
    assert not forced.decided


def test_costs_are_not_asked_for_when_k_does_not_need_them():
    def no_costs():
        raise AssertionError("measured costs for a fixed K")

    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(8, 2.4, 0.9))
    for choice in (KChoice("fixed", 3), KChoice("auto")):
        assert isinstance(_policy(choice, costs=no_costs)[0], FixedK)


def test_auto_uses_the_stored_best_k():
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(8, 2.4, 0.9))
    policy, source = _policy(KChoice("auto"))
    assert isinstance(policy, FixedK) and policy.k == 8 and "2.40×" in str(source)
    # Sampled decoding has no measurement yet: adaptive.
    assert isinstance(_policy(KChoice("auto"), temperature=0.8)[0], AdaptiveK)


def test_auto_falls_back_to_plain_where_bench_measured_it_faster_unless_forced():
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(0, 0.85, 0.7))
    policy, source = _policy(KChoice("auto"))
    assert policy.k == 0 and "0.85×" in str(source) and "--force-spec" in str(source)
    policy, _ = _policy(KChoice("auto"), force_spec=True)
    assert policy.k == 6  # the pair's recommended K


def test_explicit_k_wins_and_no_draft_is_plain():
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(0, 0.85, 0.7))
    assert _policy(KChoice("fixed", 3))[0].k == 3
    assert _policy(KChoice("auto"), draft=None)[0].k == 0
    assert isinstance(_policy(KChoice("auto"), draft=None, drafter="ngram")[0], AdaptiveK)


def test_auto_with_ngram_drafts_chooses_k_online_whatever_the_draft_model_measured():
    # Bench found the draft model slower than plain here; free n-gram drafts may still win.
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(0, 0.85, 0.7))
    policy, source = _policy(KChoice("auto"), drafter="ngram")
    assert isinstance(policy, AdaptiveK) and str(source) == "K adaptive"
    # The hybrid (the default drafter): the stored K for its draft model, n-gram K online.
    policy, source = _policy(KChoice("auto"), drafter="hybrid")
    assert isinstance(policy, PerSource) and str(source).endswith("n-gram K adaptive")
    model, ngram = policy.policies["model"], policy.policies["ngram"]
    assert isinstance(model, FixedK) and model.k == 0 and isinstance(ngram, AdaptiveK)
    assert policy.choose("model") == 0 and ngram.worth_drafting
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(8, 2.4, 0.9))
    policy, source = _policy(KChoice("auto"), drafter="hybrid")
    assert isinstance(policy, PerSource) and policy.choose("model") == 8 and "2.40×" in str(source)


def test_tuning_file_survives_a_corrupt_write_and_keeps_other_pairs():
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(4, 1.3, 0.8))
    store_measurement(Path("other.gguf"), DRAFT, 0.0, BenchResult(2, 1.1, 0.6))
    assert len(next(iter(load_tuning().values()))) == 2
    tuning_path().write_text("{not json")
    assert load_tuning() is None  # unreadable: treated as no measurement (with a warning), not a crash
    assert stored_measurement(VERIFIER, DRAFT, 0.0) is None


def test_a_draft_variant_entry_comes_back_as_a_typed_value_and_a_bad_one_is_a_warning(capsys):
    from specgguf.llama.variants import ORIGINAL_VARIANT, parse_variant

    hot = parse_variant("q4_0+hot32k")
    measured = tuning.MeasuredVariants(
        hot, (tuning.Candidate(ORIGINAL_VARIANT, 20.0, 0.8, 22.0), tuning.Candidate(hot, 10.0, 0.75, 30.0))
    )
    tuning.keep_draft_variant("draft_variant|k", measured)
    assert tuning.stored_draft_variant("draft_variant|k") == measured and measured.best.variant == hot
    entry = load_tuning()[tuning.machine_id()]["draft_variant|k"]
    assert entry["choice"] == "q4_0+hot32k" and entry["candidates"][1]["name"] == "q4_0+hot32k"  # names on disk
    for name in ("q4_0+", "q4_0+hot7k", "auto"):  # not variants: the entry is ignored, never a KeyError
        bad = {"choice": name, "candidates": [dict(entry["candidates"][1], name=name)]}
        data = load_tuning()
        data[tuning.machine_id()]["draft_variant|bad"] = bad
        tuning_path().write_text(json.dumps(data))
        assert tuning.stored_draft_variant("draft_variant|bad") is None
        assert f"unknown variant in {name!r}" in capsys.readouterr().err
    # An acceptance is a chance: one past 1 (an edited file) would price every reading as sure to pay.
    data = load_tuning()
    data[tuning.machine_id()]["draft_variant|bad"] = dict(
        entry, candidates=[dict(entry["candidates"][1], acceptance=7.5)]
    )
    tuning_path().write_text(json.dumps(data))
    assert tuning.stored_draft_variant("draft_variant|bad") is None
    assert "candidate field 'acceptance' is 7.5" in capsys.readouterr().err


def test_the_draft_variants_listed_for_a_pair_are_those_measured_with_this_process_s_pages(monkeypatch, tmp_path):
    from specgguf.llama import huge_pages
    from specgguf.llama.variants import ORIGINAL_VARIANT, parse_variant

    draft, verifier = tmp_path / "small.gguf", tmp_path / "big.gguf"
    draft.write_bytes(b"GGUF" + b"\0" * 10)
    verifier.write_bytes(b"GGUF" + b"\0" * 20)
    hot = parse_variant("q4_0+hot32k")
    chose = {}
    for paged, variant in ((True, hot), (False, ORIGINAL_VARIANT)):  # each kept as a run with or without them keeps it
        monkeypatch.setattr(huge_pages, "in_use", lambda paged=paged: paged)
        chose[paged] = tuning.MeasuredVariants(variant, (tuning.Candidate(variant, 20.0, 0.8, 22.0),))
        key = tuning.draft_variant_key(draft, SimpleNamespace(path=verifier, n_threads=2, n_gpu_layers=0))
        tuning.keep_draft_variant(key, chose[paged])
    for paged in (True, False):
        monkeypatch.setattr(huge_pages, "in_use", lambda paged=paged: paged)
        assert tuning.stored_draft_variants(draft, verifier) == [("2", chose[paged])]


def test_what_a_run_learned_of_the_costs_is_kept_only_after_enough_steps(tmp_path):
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    (tmp_path / "d.gguf").write_bytes(b"d" * 5)
    verifier, draft = (
        SimpleNamespace(path=tmp_path / name, n_threads=2, n_gpu_layers=0) for name in ("v.gguf", "d.gguf")
    )
    # The first run's probe met a busy machine: every cost stored 4x too high.
    true = MachineCosts((0.0335, 0.052, 0.066, 0.079, 0.095, 0.117), draft=0.0205)
    busy = MachineCosts(tuple(4 * c for c in true.verify), draft=4 * true.draft, draft_read=0.004)
    tuning.store_seconds(tuning.key_for(verifier), list(busy.verify))
    tuning.store_seconds(tuning.key_for(draft, "draft_costs"), [busy.draft])
    tuning.store_seconds(tuning.key_for(draft, "draft_read"), [busy.draft_read])
    resolved = SimpleNamespace(verifier=verifier.path, draft=draft.path, recommended_k=None)
    prepared = Prepared(resolved=resolved, verifier=verifier, draft=draft, options=DraftOptions())
    assert prepared.costs == busy  # read back, nothing measured
    policy, _ = prepared.policy(temperature=0.0)
    assert isinstance(policy, PerSource)

    def step(k, source):
        seconds = true.verify[k] * (1.1 if k % 2 else 0.95)  # the steps vary; the median is robust
        event = StepEvent([1] * k, [], 3, k, k, true.draft * k, seconds, 0.0, draft_source=source if k else None)
        policy.observe(event)

    for i in range(LEARNED_MIN_STEPS - 1):  # plain steps, n-gram drafts and the draft model's
        step(i % 3, ("model", "ngram")[i % 2])
    assert prepared.keep_learned_costs(policy) is None  # a short run keeps nothing
    assert tuning.stored(verifier) == list(busy.verify) and prepared.costs == busy
    step(1, "model")
    learned = prepared.keep_learned_costs(policy)
    assert learned is not None and prepared.costs == learned
    # The sizes the steps ran are the measured ones; the others follow their scale (~0.25).
    np.testing.assert_allclose(learned.verify[:3], [0.95 * true.verify[0], 1.1 * true.verify[1], 0.95 * true.verify[2]])
    np.testing.assert_allclose(learned.verify[3:], np.array(true.verify[3:]), rtol=0.1)
    assert learned.draft == pytest.approx(true.draft)
    # The next run starts from what this one learned.
    assert tuning.probe(verifier, draft, on_measure=pytest.fail) == MachineCosts(
        tuple(round(c, 6) for c in learned.verify), round(learned.draft, 6), busy.draft_read
    )  # (the draft's reading is its own measurement: the steps do not relearn it)


@pytest.mark.parametrize(
    "kind, costs",
    [
        ("verify_costs", [0.01]),  # one batch size: MachineCosts refused it with a ValueError, a traceback
        ("verify_costs", [1e-320, 0.02]),  # a NaN in the K policy
        ("verify_costs", [0.01, 7200.0]),  # past an hour
        ("draft_costs", [0.01, 0.02]),  # a draft's cost is one number
        ("draft_costs", [1e-7]),  # under a microsecond
        ("draft_read", [0.002, 0.003]),  # a draft's reading is one number a token
    ],
)
def test_stored_costs_of_the_wrong_length_or_an_implausible_size_are_one_warning_and_ignored(kind, costs, capsys):
    key = f"{kind}|model-{costs}.gguf|1|threads=1|gpu_layers=0"  # its own warning (each is told once)
    tuning_path().write_text(json.dumps({tuning.machine_id(): {key: costs}}))
    assert tuning.stored_seconds(key) is None
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"specgguf: warning: {tuning_path()}: {key}: expected a list of ")
    assert "each from 1 µs to 1 h" in warning
    good = [0.01, 0.02] if kind == "verify_costs" else [0.01]
    tuning.store_seconds(key, good)
    assert tuning.stored_seconds(key) == good


def test_a_fixed_k_prices_its_drafts_catch_up_as_measured_and_asks_only_where_a_draft_model_drafts():
    # A prompt the verifier's cache held is read in one token's pass: priced from that pass, the draft's
    # catch-up looked 10-30 times dearer than it is and a fixed K drafted nothing for whole answers.
    policy, _ = _policy(KChoice("fixed", 4), read=lambda: 0.004)
    assert policy.read_seconds("model") == 0.004 and policy.read_seconds("ngram") is None
    store_measurement(VERIFIER, DRAFT, 0.0, BenchResult(8, 2.4, 0.9))
    policy, _ = _policy(KChoice("auto"), read=lambda: 0.004)  # bench's stored K
    assert isinstance(policy, FixedK) and policy.k == 8 and policy.read_seconds("model") == 0.004

    def not_asked():
        raise AssertionError("measured the draft's reading for a K that reads nothing")

    assert _policy(KChoice("fixed", 0), read=not_asked)[0].read_seconds("model") is None
    assert _policy(KChoice("fixed", 3), drafter="ngram", read=not_asked)[0].k == 3
    assert _policy(KChoice("fixed", 3), draft=None, read=not_asked)[0].k == 0


def test_the_chosen_drafts_measured_acceptance_prices_a_long_read_before_its_drafts_are_seen():
    # drafts/made.py measured each candidate greedy against this verifier: the chosen one's acceptance is
    # what a long read is priced to buy until the draft's own drafts have shown what they do.
    original, q4_0 = parse_variant("original"), parse_variant("q4_0")
    candidates = (Candidate(original, 33.0, 0.70, 11.0), Candidate(q4_0, 31.0, 0.85, 11.5))
    resolved = SimpleNamespace(verifier=VERIFIER, draft=DRAFT, recommended_k=None)
    chosen = DraftChoice(q4_0, DRAFT, "measured here", candidates)
    prepared = Prepared(
        resolved=resolved, verifier=object(), draft=object(), options=DraftOptions(), draft_choice=chosen
    )
    prepared._costs = MEMORY_BOUND
    assert prepared.measured_acceptance == 0.85
    for temperature in (0.0, 0.8):
        policy, _ = prepared.policy(KChoice("adaptive"), temperature=temperature, drafter="model")
        assert isinstance(policy, AdaptiveK) and policy.config.measured_acceptance == 0.85
    # Not measured (a variant named on the command line), another vocabulary's, or no draft: none.
    named = DraftChoice(q4_0, DRAFT, "--draft-variant q4_0")
    assert dataclasses.replace(prepared, draft_choice=named).measured_acceptance is None
    crossed = dataclasses.replace(chosen, cross=True)
    assert dataclasses.replace(prepared, draft_choice=crossed).measured_acceptance is None
    assert dataclasses.replace(prepared, draft=None).measured_acceptance is None
