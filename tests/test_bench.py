"""`specgguf bench` on tiny generated models: the report's structure and its arithmetic."""

from __future__ import annotations

import json
import os
import statistics

import pytest

from specgguf.core.costs import disturbed

# bench stores per thread count, and a run after it must find what it stored.
pytestmark = pytest.mark.usefixtures("one_usable_core")


@pytest.fixture(scope="module")
def report(cli, tiny_verifier, tiny_draft, tmp_path_factory):
    config = tmp_path_factory.mktemp("config")
    result = cli(
        "bench",
        "-m",
        tiny_verifier,
        "-md",
        tiny_draft,
        "--quick",
        "--json",
        "--drafters",
        "model,ngram,hybrid",
        "--plot",
        config / "speedup.png",
        env={"XDG_CONFIG_HOME": str(config)},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), config


def test_report_structure(report):
    data, _ = report
    assert data["prompts"] == ["code", "edit"] and data["repeats"] == 1 and data["max_tokens"] == 48
    (result,) = data["results"]
    labels = [row["label"] for row in result["settings"]]
    assert labels == [
        "plain",
        "model K=4",
        "model K=8",
        "model K=adaptive",
        "ngram K=4",
        "ngram K=8",
        "ngram K=adaptive",
        "hybrid K=4",
        "hybrid K=8",
        "hybrid K=adaptive",
    ]
    for row in result["settings"]:
        assert set(row["time_split"]) == {"draft", "verify", "other"}
        assert 0.0 <= row["overhead"] <= 1.0 and len(row["runs"]) == 2
        if row["k"] == 0 or row["acceptance_rate"] is None:
            # (a draft model may wait out a long prompt for all of a 48-token answer: drafting.py)
            assert row["acceptance_by_position"] == [] and row["tokens_per_step"] == 1.0
        else:
            assert len(row["acceptance_by_position"]) >= 1
    # Lookups draft from the second step (the first token is the prompt pass's); a draft model on these
    # tiny models may wait out both prompts.
    for drafter in ("ngram", "hybrid"):
        assert any(row["acceptance_rate"] is not None for row in result["settings"] if row["drafter"] == drafter)


def test_ratios_are_consistent_with_the_reports_own_timings(report):
    data, _ = report
    settings = data["results"][0]["settings"]
    plain = {run["prompt"]: run["n_tokens"] / run["seconds"] for run in settings[0]["runs"]}
    for row in settings:
        total_tokens = sum(run["n_tokens"] for run in row["runs"])
        total_seconds = sum(run["seconds"] for run in row["runs"])
        assert row["tokens_per_second"] == pytest.approx(total_tokens / total_seconds, rel=1e-3, abs=2e-3)
        if row["k"] == 0:
            continue
        ratios = {run["prompt"]: run["n_tokens"] / run["seconds"] / plain[run["prompt"]] for run in row["runs"]}
        # The report rounds ratios to 3 decimals and seconds to 6.
        assert row["speedup_by_prompt"] == pytest.approx(ratios, abs=2e-3)
        assert row["speedup"] == pytest.approx(statistics.median(ratios.values()), abs=2e-3)
        assert row["speedup_min"] == pytest.approx(min(ratios.values()), abs=2e-3)
        assert row["speedup_max"] == pytest.approx(max(ratios.values()), abs=2e-3)


def test_best_k_is_stored_for_auto_and_the_plot_is_written(cli, report, tiny_verifier, tiny_draft):
    data, config = report
    best = data["results"][0]["best_k"]["0.0"]
    fixed = [row for row in data["results"][0]["settings"] if row["drafter"] == "model" and row["k"] in (4, 8)]
    winner = max(fixed, key=lambda row: row["speedup"])
    assert best["k"] == (winner["k"] if winner["speedup"] > 1.0 else 0)
    stored = json.loads((config / "specgguf" / "tuning.json").read_text())
    (per_pair,) = stored.values()
    assert per_pair[f"{tiny_verifier.name}|{tiny_draft.name}"]["greedy"]["k"] == best["k"]
    assert (config / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    # `run -k auto` now takes K from the stored measurement and says so.
    run = cli(
        "run",
        "-m",
        tiny_verifier,
        "-md",
        tiny_draft,
        "--temp",
        "0",
        "-n",
        "8",
        "--json",
        "the",
        env={"XDG_CONFIG_HOME": str(config)},
    )
    source = json.loads(run.stdout)["k_source"]
    assert ("bench here" in source) if best["k"] else source.startswith("plain: bench measured")


def test_verify_costs_are_measured_stored_and_used_by_adaptive_k(cli, report, tiny_verifier, tiny_draft):
    data, config = report
    measured = data["results"][0]["verify_ms_by_batch"]
    assert len(measured) == 17 and all(ms > 0 for ms in measured)  # batches of 1..K_MAX + 1 tokens
    (per_machine,) = json.loads((config / "specgguf" / "tuning.json").read_text()).values()
    (key,) = [key for key in per_machine if key.startswith("verify_costs|")]
    assert f"|{tiny_verifier.name}|{tiny_verifier.stat().st_size}|threads=" in key
    stored_ms = [s * 1000 for s in per_machine[key]]
    if disturbed([ms / 1000 for ms in measured]):
        # Measured while the machine was busy, three tries (a tiny model's passes take 0.1 ms): bench keeps
        # no such table (tuning.store_measured); its adaptive runs probed their own and kept that.
        assert len(stored_ms) != len(measured)
    else:
        # Stored in seconds to 6 decimals, reported in ms to 2: equal to within the two roundings.
        assert stored_ms == pytest.approx(measured, abs=0.006)
    tuning = config / "specgguf" / "tuning.json"
    before = tuning.read_text()
    with_costs = cli(
        "run",
        "-m",
        tiny_verifier,
        "--drafter",
        "ngram",
        "--temp",
        "0",
        "-n",
        "8",
        "the",
        env={"XDG_CONFIG_HOME": str(config)},
    )
    assert "K adaptive" in with_costs.stderr and "measuring" not in with_costs.stderr
    assert tuning.read_text() == before  # bench's table was used: nothing measured, nothing stored
    # The table holds for the thread count it was measured with (all free cores when bench started).
    measured_threads = int(key.split("threads=")[1].split("|")[0])
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one usable core: no other thread count to run with")
    other_threads = cli(
        "run",
        "-m",
        tiny_verifier,
        "--drafter",
        "ngram",
        "--temp",
        "0",
        "-n",
        "8",
        "-t",
        "1" if measured_threads > 1 else "2",
        "the",
        env={"XDG_CONFIG_HOME": str(config)},
    )
    assert "measuring this machine's costs" in other_threads.stderr
    (per_machine,) = json.loads(tuning.read_text()).values()
    assert len([key for key in per_machine if key.startswith("verify_costs|")]) == 2
