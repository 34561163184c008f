"""A draft made for this machine (draft_variant.py): derived into the cache by SHA-256, never touching the
user's file, lossless like any draft, chosen by measurement and kept in tuning.json."""

from __future__ import annotations

import json
import os

import pytest

from specgguf import draft_variant, tuning
from specgguf.core.costs import MachineCosts
from specgguf.core.kpolicy import expected_rate
from specgguf.llama.convert import DRAFT_VARIANTS
from specgguf.llama.model import LlamaModel
from test_backend import _check_greedy_per_step


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _load(path):
    return LlamaModel(path, n_ctx=256, n_threads=1)


def test_a_variant_is_derived_once_into_the_cache_by_sha256_and_the_users_file_is_untouched(cache, tiny_draft):
    before = (tiny_draft.read_bytes(), tiny_draft.stat().st_mtime_ns)
    path = draft_variant.derive(tiny_draft, "q4_0")
    assert path.parent == cache / "drafts" and path.name.endswith("-q4_0.gguf") and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size < tiny_draft.stat().st_size
    assert (tiny_draft.read_bytes(), tiny_draft.stat().st_mtime_ns) == before
    made = path.stat().st_mtime_ns
    assert draft_variant.derive(tiny_draft, "q4_0") == path and path.stat().st_mtime_ns == made  # reused
    assert not list((cache / "drafts").glob("*.incomplete"))


def test_the_cache_follows_the_files_contents_not_its_name(cache, tiny_dir, tiny_draft):
    copy = tiny_dir / "copy-of-draft.gguf"
    copy.write_bytes(tiny_draft.read_bytes())
    assert draft_variant.derived_path(copy, "q4_0") == draft_variant.derived_path(tiny_draft, "q4_0")
    changed = tiny_dir / "changed-draft.gguf"
    data = bytearray(tiny_draft.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    assert draft_variant.derived_path(changed, "q4_0") != draft_variant.derived_path(tiny_draft, "q4_0")


@pytest.mark.parametrize("name", ["q4_0", "q4_0-q8head"])
def test_every_variant_drafts_losslessly(cache, tiny_verifier, tiny_draft, name):
    """Greedy: every emitted token is the verifier's argmax for its context, whatever the draft."""
    events, output = _check_greedy_per_step(
        tiny_verifier, draft_variant.derive(tiny_draft, name), "the cat was there", k=4, max_tokens=40
    )
    assert len(output) == 40 and sum(event.n_drafted for event in events) > 0


def test_expected_rate_is_the_best_k_of_e_over_t():
    costs = MachineCosts(verify=(0.1, 0.12, 0.14, 0.16, 0.18, 0.2), draft=0.02)
    a = 0.8
    rates = [sum(a**i for i in range(k + 1)) / (k * 0.02 + 0.1 + 0.02 * k) for k in range(1, 6)]
    assert expected_rate(costs, a) == pytest.approx(max(rates), rel=1e-6)
    assert expected_rate(MachineCosts(costs.verify, 0.01), a) > expected_rate(costs, a)  # a cheaper draft
    assert expected_rate(costs, 0.9) > expected_rate(costs, a)  # a draft more often right


def test_auto_measures_once_keeps_the_choice_and_then_reuses_it(cache, tiny_verifier, tiny_draft, monkeypatch):
    monkeypatch.setattr(draft_variant, "MIN_DERIVED_BYTES", 0)  # the tiny draft counts as big enough
    verifier = _load(tiny_verifier)
    said = []
    first = draft_variant.choose(verifier, tiny_draft, "auto", load=_load, announce=said.append)
    assert said and first.name in ("original", *draft_variant.AUTO_CANDIDATES)
    assert {c.name for c in first.candidates} == {"original", *draft_variant.AUTO_CANDIDATES}
    best = max(first.candidates, key=lambda c: c.expected_tokens_per_second)
    assert first.name == best.name and "measured here" in first.why
    assert all(0 <= c.acceptance <= 1 and c.ms_per_token > 0 for c in first.candidates)
    stored = json.loads(tuning.tuning_path().read_text())
    (entries,) = stored.values()
    assert [key for key in entries if key.startswith("draft_variant|")]

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(draft_variant, "calibrate", no_measuring)
    again = draft_variant.choose(verifier, tiny_draft, "auto", load=_load, announce=said.append)
    assert again == first and len(said) == 1
    verifier.close()


def test_a_damaged_stored_choice_is_a_warning_and_measured_again(cache, tiny_verifier, tiny_draft, monkeypatch, capsys):
    monkeypatch.setattr(draft_variant, "MIN_DERIVED_BYTES", 0)
    verifier = _load(tiny_verifier)
    key = tuning.draft_variant_key(tiny_draft, verifier)
    tuning.keep_draft_variant(key, {"choice": "q9_9", "candidates": [{"name": "q9_9"}]})
    choice = draft_variant.choose(verifier, tiny_draft, "auto", load=_load)
    assert choice.candidates and "warning" in capsys.readouterr().err
    verifier.close()


def test_a_small_draft_is_used_as_given(tiny_verifier, tiny_draft):
    verifier = _load(tiny_verifier)
    choice = draft_variant.choose(verifier, tiny_draft, "auto", load=_load)
    assert (choice.name, choice.path) == ("original", tiny_draft)
    verifier.close()


def test_run_takes_a_variant_by_name_and_reports_it(cli, cache, tiny_verifier, tiny_draft):
    result = cli(
        "run", "-m", tiny_verifier, "-md", tiny_draft, "--draft-variant", "q4_0", "-k", "4", "--temp", "0",
        "-n", "8", "--json", "the",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["draft_variant"]["name"] == "q4_0"
    assert os.path.dirname(report["settings"]["draft_variant"]["file"]) == str(cache / "drafts")


def test_an_unknown_variant_is_one_line(cli, tiny_verifier, tiny_draft):
    result = cli("run", "-m", tiny_verifier, "-md", tiny_draft, "--draft-variant", "q3_x", "the")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"specgguf: error: --draft-variant must be one of auto, original, {', '.join(DRAFT_VARIANTS)}, not 'q3_x'"
    ]
