"""Drafts of another vocabulary found on disk (drafts/cross_search.py): found for `-m` alone and by
`pairs --local` with their overlap, ranked after the drafts that share the vocabulary unless measured
faster, measured against n-gram drafts alone before adoption (the measurement injected here, to force
both outcomes without timing), and the kept decision reused. Over fake stores of tiny generated GGUFs
of two vocabularies (SentencePiece and byte-level BPE)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fake_stores import add_lmstudio_model, add_ollama_model
from specgguf import tuning
from specgguf.core.cross_drafter import DEFAULT_CROSS_MODE
from specgguf.drafts import cross_search
from specgguf.drafts.cross_search import Trial, find_any_draft
from specgguf.llama.model import LlamaModel
from tiny_gguf import write_tiny_llama

FASTER = Trial(0.1, 0.8, 900.0, 500.0, 400.0)  # beats n-gram drafts alone and plain decoding
SLOWER = Trial(0.1, 0.1, 300.0, 500.0, 400.0)  # n-gram drafts alone do better

FOUND_TRIAL = cross_search.trial_name(DEFAULT_CROSS_MODE)  # a found draft is tried in the default mode


# A trial is kept per thread count, and a second run must find it.
pytestmark = pytest.mark.usefixtures("one_usable_core")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    """A verifier (SentencePiece), a small draft sharing its vocabulary, and a small one of another (BPE)."""
    folder = tmp_path_factory.mktemp("cross-ggufs")
    return {
        "big": write_tiny_llama(folder / "big.gguf", base_seed=7, n_embd=128, n_layer=4),
        "small": write_tiny_llama(folder / "small.gguf", base_seed=7, n_embd=32, n_layer=1, n_head=2),
        "other": write_tiny_llama(folder / "other.gguf", base_seed=7, n_embd=32, n_layer=1, n_head=2, vocab_type="bpe"),
    }


@pytest.fixture
def stores(tmp_path, monkeypatch, config_home) -> tuple[Path, Path]:
    """Empty Ollama store, LM Studio folder, specgguf cache and tuning.json: nothing else is local."""
    ollama, lmstudio = tmp_path / "ollama" / "models", tmp_path / "lmstudio" / "models"
    ollama.mkdir(parents=True)
    lmstudio.mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("SPECGGUF_LMSTUDIO_MODELS", str(lmstudio))
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return ollama, lmstudio


class Scripted:
    """The measurement, scripted: returns `trial` (or `trial[mode]`) and counts its calls (what was
    measured, not timed), with the mode of each."""

    def __init__(self, trial: Trial | dict[str, Trial]):
        self.trial, self.modes = trial, list[str]()

    @property
    def calls(self) -> int:
        return len(self.modes)

    def __call__(self, verifier, draft, cross) -> Trial:
        assert cross.vocab_map.overlap > 0.3 and draft.n_vocab == len(cross.vocab_map.to_verifier) != verifier.n_vocab
        self.modes.append(cross.mode)
        return self.trial[cross.mode] if isinstance(self.trial, dict) else self.trial


def run_json(cli, *args):
    result = cli("run", *args, "-n", "6", "--temp", "0", "--seed", "1", "--json", "the cat")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), " ".join(result.stderr.split())


def test_search_finds_a_draft_of_another_vocabulary_and_says_its_overlap(ggufs, stores):
    ollama, _ = stores
    verifier = add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_ollama_model(ollama, "other", "small", ggufs["other"])
    found = find_any_draft(verifier)
    assert found is not None and found.cross and found.draft == draft
    assert re.search(
        r"draft: ollama:other:small: other vocabulary, \d+% of the verifier's tokens shared", found.message
    )
    assert "measured against n-gram drafts alone before it is used" in found.message


def test_a_draft_sharing_the_vocabulary_ranks_first_unless_the_other_measured_faster(ggufs, stores):
    ollama, _ = stores
    verifier = add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    same = add_ollama_model(ollama, "tiny", "small", ggufs["small"])
    other = add_ollama_model(ollama, "other", "small", ggufs["other"])
    found = find_any_draft(verifier)
    assert found is not None and not found.cross and found.draft == same
    # Both measured here: the same-vocabulary draft's variants at 600 tok/s, the other's trial at 900.
    key = f"{tuning.model_key('draft_variant', same, n_threads=2, n_gpu_layers=0)}|" + tuning.model_key(
        "verifier", verifier, n_threads=2, n_gpu_layers=0
    )
    variants = {
        "choice": "original",
        "candidates": [{"name": "original", "ms_per_token": 0.1, "acceptance": 0.5, "expected_tokens_per_second": 600}],
    }
    tuning.keep_entry(key, variants)
    cross_key = key.replace(f"draft_variant|{same.name}|", f"{FOUND_TRIAL}|{other.name}|").replace(
        f"|{same.stat().st_size}|", f"|{other.stat().st_size}|", 1
    )
    tuning.keep_entry(cross_key, FASTER.as_json())
    found = find_any_draft(verifier)
    assert found is not None and found.cross and found.draft == other
    assert "measured here faster than the draft that shares it" in found.message
    tuning.keep_entry(cross_key, Trial(0.1, 0.5, 550.0, 500.0, 400.0).as_json())  # faster than n-grams, not it
    found = find_any_draft(verifier)
    assert found is not None and found.draft == same


def test_run_alone_measures_the_draft_adopts_it_where_it_beats_ngrams_and_keeps_the_decision(
    cli, ggufs, stores, monkeypatch
):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_ollama_model(ollama, "other", "small", ggufs["other"])
    measured = Scripted(FASTER)
    monkeypatch.setattr(cross_search, "measure_trial", measured)
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert sorted(measured.modes) == ["string", "tokens"]  # --cross-mode auto: both, once each
    assert report["settings"]["model_draft"] == str(draft) and report["settings"]["drafter"] == "hybrid"
    assert "other vocabulary" in report["settings"]["draft_variant"]["why"]
    assert "measured here: string-level: 900.0 tok/s expected" in report["settings"]["draft_variant"]["why"]
    assert "ollama:other:small: other vocabulary" in stderr
    again, stderr = run_json(cli, "-m", "ollama:tiny:big")  # kept in tuning.json: not measured again
    assert measured.calls == 2 and again["settings"]["model_draft"] == str(draft)
    assert "measured here: string-level: 900.0 tok/s" in stderr
    (entries,) = json.loads(tuning.tuning_path().read_text()).values()
    for mode in ("tokens", "string"):
        (kept,) = [value for key, value in entries.items() if key.startswith(f"{cross_search.trial_name(mode)}|")]
        assert Trial.from_json(kept) == FASTER


def test_run_alone_declines_a_draft_that_loses_to_ngrams_and_the_next_run_does_not_load_it(
    cli, ggufs, stores, monkeypatch
):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    measured = Scripted(SLOWER)
    monkeypatch.setattr(cross_search, "measure_trial", measured)
    result = cli("run", "-m", "ollama:tiny:big", "-n", "6", "--temp", "0", "--seed", "1", "the cat")
    assert result.returncode == 0, result.stderr
    assert measured.calls == 2  # each mode
    assert "not drafting with it: n-gram drafts alone" in " ".join(result.stderr.split())
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert measured.calls == 2  # the kept decision: measured once
    assert report["settings"]["drafter"] == "ngram" and report["settings"]["model_draft"] is None
    assert "ollama:other:small: other vocabulary" in stderr and "measured here slower" in stderr
    assert "n-grams alone" in stderr


def test_a_pair_drafts_in_the_mode_measured_faster_and_check_pairs_and_bench_say_which(cli, ggufs, stores, monkeypatch):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    measured = Scripted({"tokens": FASTER, "string": Trial(0.1, 0.6, 700.0, 500.0, 400.0)})
    monkeypatch.setattr(cross_search, "measure_trial", measured)
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    why = report["settings"]["draft_variant"]["why"]
    assert measured.calls == 2 and "string-level" not in why.split(";")[0]  # drafts in shared tokens
    assert "measured here: shared tokens: 900.0 tok/s expected" in why and "string-level 700.0 tok/s" in why
    listed = cli("pairs", "--local", "--json")
    (cross,) = [row for row in json.loads(listed.stdout) if row["vocabulary"] == "other"]
    assert cross["measured"]["mode"] == "tokens" and cross["measured"]["adopted"]
    assert cross["measured"]["expected_tokens_per_second"] == 900.0 and set(cross["measured"]["modes"]) == {
        "tokens",
        "string",
    }
    assert "shared tokens measured faster than n-grams" in " ".join(cli("pairs", "--local").stdout.split())
    checked = " ".join(cli("check", "ollama:other:small", "ollama:tiny:big").stdout.split())
    assert "cross mode" in checked and "measured here: shared tokens: 900.0 tok/s" in checked
    bench = cli("bench", "-m", "ollama:tiny:big", "-md", "ollama:other:small", "--quick", "-k", "2", "--no-adaptive",
                "--drafters", "model", "--json", "--no-store")  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["results"][0]["cross_mode"] == "tokens"  # as run drafts
    assert measured.calls == 2  # none of them measured again


def test_a_draft_given_with_md_is_measured_in_both_modes_unless_one_is_named_and_drafted_as_asked(
    cli, ggufs, stores, monkeypatch
):
    measured = Scripted(SLOWER)  # n-gram drafts alone do better in both modes
    monkeypatch.setattr(cross_search, "measure_trial", measured)
    named, _ = run_json(cli, "-m", ggufs["big"], "-md", ggufs["other"], "--cross-mode", "tokens")
    assert measured.modes == [] and named["settings"]["model_draft"] == str(ggufs["other"])  # named: not measured
    result = cli("run", "-m", ggufs["big"], "-md", ggufs["other"], "-n", "6", "--temp", "0", "the cat")
    assert result.returncode == 0, result.stderr
    assert sorted(measured.modes) == ["string", "tokens"]
    assert "drafting with it as asked (n-gram drafts alone measured faster" in " ".join(result.stderr.split())
    report, _ = run_json(cli, "-m", ggufs["big"], "-md", ggufs["other"])
    assert report["settings"]["model_draft"] == str(ggufs["other"]) and measured.calls == 2  # asked for; kept


def test_a_damaged_kept_trial_is_measured_again(cli, ggufs, stores, monkeypatch):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    measured = Scripted(SLOWER)
    monkeypatch.setattr(cross_search, "measure_trial", measured)
    run_json(cli, "-m", "ollama:tiny:big")
    assert measured.calls == 2
    path = tuning.tuning_path()
    data = json.loads(path.read_text())
    (entries,) = data.values()
    (key,) = [key for key in entries if key.startswith(f"{FOUND_TRIAL}|")]
    entries[key] = {"acceptance": "high"}
    path.write_text(json.dumps(data))
    result = cli("run", "-m", "ollama:tiny:big", "-n", "4", "--temp", "0", "the cat")
    assert result.returncode == 0, result.stderr
    assert measured.modes[2:] == [DEFAULT_CROSS_MODE]  # the damaged one alone
    assert "warning" in result.stderr and "Traceback" not in result.stderr


def test_the_real_measurement_declines_a_draft_that_never_agrees(ggufs, stores):
    """The tiny random models never agree (acceptance 0): whatever the timings, n-grams win."""
    verifier, draft = LlamaModel(ggufs["big"], n_ctx=256), LlamaModel(ggufs["other"], n_ctx=256)
    try:
        from specgguf.drafts.cross_vocab import cross_vocab

        cross = cross_vocab(draft, verifier)
        trial = cross_search.adopt(verifier, draft, cross)
        assert 0.0 <= trial.acceptance <= 1.0 and trial.ngram_tokens_per_second > 0 and trial.ms_per_token > 0
        if trial.acceptance == 0.0:
            assert not trial.adopted
        kept = cross_search.adopt(verifier, draft, cross, measure=Scripted(FASTER))  # kept: not measured again
        assert kept == Trial.from_json(trial.as_json())
    finally:
        verifier.close()
        draft.close()


def test_a_trial_is_kept_per_cross_mode(ggufs, stores):
    """`--cross-mode string` is measured on its own (its own tuning.json entry), then kept."""
    from dataclasses import replace

    from specgguf.drafts.cross_vocab import cross_vocab

    verifier, draft = LlamaModel(ggufs["big"], n_ctx=256), LlamaModel(ggufs["other"], n_ctx=256)
    try:
        cross = cross_vocab(draft, verifier, "tokens")
        assert cross_search.adopt(verifier, draft, cross, measure=Scripted(SLOWER)) == SLOWER
        string = Scripted(FASTER)
        assert cross_search.adopt(verifier, draft, replace(cross, mode="string"), measure=string) == FASTER
        assert cross_search.adopt(verifier, draft, replace(cross, mode="string"), measure=string) == FASTER
        assert string.calls == 1
        assert cross_search.adopt(verifier, draft, cross, measure=Scripted(FASTER)) == SLOWER  # tokens: kept
    finally:
        verifier.close()
        draft.close()


def test_pairs_local_lists_drafts_of_another_vocabulary_with_overlap_after_the_others(cli, ggufs, stores):
    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    result = cli("pairs", "--local", "--json")
    assert result.returncode == 0, result.stderr
    same, cross = json.loads(result.stdout)
    assert same["vocabulary"] == "same" and same["draft"] == "lmstudio:pub/Tiny-GGUF/small.gguf"
    assert cross["vocabulary"] == "other" and cross["draft"] == "ollama:other:small"
    assert cross["verifier"] == "ollama:tiny:big" and 0.3 <= cross["overlap"] <= 1 and cross["measured"] is None
    assert (
        cross["why"] == f"ollama:other:small: other vocabulary, {cross['overlap']:.0%} of the verifier's tokens shared"
    )
    table = cli("pairs", "--local")
    text = " ".join(table.stdout.split())
    assert (
        table.returncode == 0
        and cross["why"] in text
        and "specgguf run -m ollama:tiny:big -md ollama:other:small" in text
    )


def test_bench_runs_a_pair_of_two_vocabularies_and_shows_the_overlap(cli, ggufs, config_home, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    args = ("bench", "-m", ggufs["big"], "-md", ggufs["other"], "--quick", "-k", "2", "--drafters", "model,hybrid")
    result = cli(*args, "--json", "--no-store")
    assert result.returncode == 0, result.stderr
    (pair,) = json.loads(result.stdout)["results"]
    assert 0.3 <= pair["overlap"] <= 1 and "another vocabulary" in pair["draft_variant"]["why"]
    assert {row["label"] for row in pair["settings"]} >= {"plain", "model K=2", "hybrid K=adaptive"}
    table = cli(*args, "--no-store")
    assert table.returncode == 0, table.stderr
    assert "overlap" in table.stdout and f"{pair['overlap']:.0%}" in table.stdout


def test_the_ngram_bar_is_plain_decoding_where_nothing_repeats_and_higher_where_the_text_does():
    """core/calibration.ngram_rate on scripted verifiers: priced on the verify table alone."""
    from fakes import FakeModel, one_hot_logits
    from specgguf.core.calibration import ngram_rate

    verify = (0.010, 0.012, 0.014, 0.016, 0.018)
    counting = FakeModel(one_hot_logits(lambda context: (len(context) * 7) % 97, 97), n_vocab=97)
    plain = ngram_rate(counting, [[1, 2]], verify, k=4, max_tokens=40)
    assert plain == pytest.approx(1 / verify[0])
    cycling = FakeModel(one_hot_logits(lambda context: context[-4], 97), n_vocab=97)
    repeating = ngram_rate(cycling, [[5, 6, 7, 8, 5, 6, 7, 8]], verify, k=4, max_tokens=40)
    assert repeating > 2 / verify[0] and cycling.cached == []  # left empty, as the calibration runs do


def test_a_draft_is_of_another_vocabulary_by_its_choice_not_its_reason():
    from specgguf.drafts.made import DraftChoice
    from specgguf.llama.variants import ORIGINAL_VARIANT
    from specgguf.prepare import CROSS_WHY, pair_cross

    same = DraftChoice(ORIGINAL_VARIANT, Path("draft.gguf"), CROSS_WHY)  # the sentence alone says nothing
    assert pair_cross(object(), object(), same) == (None, same)
