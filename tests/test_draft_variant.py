"""A draft made for this machine (drafts/made.py): derived into the cache by SHA-256, never touching the
user's file, lossless like any draft, chosen by measurement and kept in tuning.json."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from specgguf import tuning
from specgguf.core.calibration import expected_rate
from specgguf.core.costs import MachineCosts
from specgguf.core.engine import speculate
from specgguf.core.hot_vocab import HotVocab
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.drafts import made
from specgguf.errors import ModelLoadError, UsageError
from specgguf.files import hot_vocab
from specgguf.files.derived import derived_path, verifier_id
from specgguf.files.hot_vocab import hot_ids
from specgguf.llama.loaded import ModelSettings
from specgguf.llama.model import LlamaModel
from specgguf.llama.variants import AUTO, ORIGINAL_VARIANT, REQUANTIZATIONS, Variant, parse_request, parse_variant
from test_backend import RecordingModel, _check_greedy_per_step
from tiny_gguf import write_tiny_llama


@pytest.fixture
def cache(tmp_path, monkeypatch, config_home):
    """An empty specgguf cache and tuning.json for one test (the session's tuning.json holds what the
    real models measured once: a test that wrote there would make every later test measure again)."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


SETTINGS = ModelSettings(n_ctx=256, n_threads=1)
Q4_0 = Variant("q4_0")


def _load(path):
    return LlamaModel(path, n_ctx=256, n_threads=1)


def test_a_variant_is_derived_once_into_the_cache_by_sha256_and_the_users_file_is_untouched(cache, tiny_draft):
    before = (tiny_draft.read_bytes(), tiny_draft.stat().st_mtime_ns)
    path = made.derive(tiny_draft, Q4_0)
    assert path.parent == cache / "drafts" and path.name.endswith("-q4_0.gguf") and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size < tiny_draft.stat().st_size
    assert (tiny_draft.read_bytes(), tiny_draft.stat().st_mtime_ns) == before
    derived_at = path.stat().st_mtime_ns
    assert made.derive(tiny_draft, Q4_0) == path and path.stat().st_mtime_ns == derived_at  # reused
    assert not list((cache / "drafts").glob("*.incomplete"))


def test_the_cache_follows_the_files_contents_not_its_name(cache, tiny_dir, tiny_draft):
    copy = tiny_dir / "copy-of-draft.gguf"
    copy.write_bytes(tiny_draft.read_bytes())
    assert derived_path(copy, "q4_0") == derived_path(tiny_draft, "q4_0")
    changed = tiny_dir / "changed-draft.gguf"
    data = bytearray(tiny_draft.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    assert derived_path(changed, "q4_0") != derived_path(tiny_draft, "q4_0")


@pytest.mark.parametrize("name", ["q4_0", "q4_0-q8head"])
def test_every_variant_drafts_losslessly(cache, tiny_verifier, tiny_draft, name):
    """Greedy: every emitted token is the verifier's argmax for its context, whatever the draft."""
    events, output = _check_greedy_per_step(
        tiny_verifier, made.derive(tiny_draft, parse_variant(name)), "the cat was there", k=4, max_tokens=40
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
    monkeypatch.setattr(made, "MIN_DERIVED_BYTES", 0)  # the tiny draft counts as big enough
    verifier = _load(tiny_verifier)
    said = []
    first = made.choose(verifier, tiny_draft, AUTO, settings=SETTINGS, announce=said.append)
    assert said and first.variant in (ORIGINAL_VARIANT, *made.AUTO_CANDIDATES)
    assert {c.variant for c in first.candidates} == {ORIGINAL_VARIANT, *made.AUTO_CANDIDATES}
    # The fastest, where one beats plain decoding here; else the original (made.pick).
    assert first.variant == made.pick(list(first.candidates), tuning.probe(verifier).verify)
    assert "measured here" in first.why
    assert all(0 <= c.acceptance <= 1 and c.ms_per_token > 0 for c in first.candidates)
    stored = json.loads(tuning.tuning_path().read_text())
    (entries,) = stored.values()
    assert [key for key in entries if key.startswith("draft_variant|")]

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(made, "calibrate", no_measuring)
    again = made.choose(verifier, tiny_draft, AUTO, settings=SETTINGS, announce=said.append)
    assert again == first and len(said) == 1
    verifier.close()


def test_a_damaged_stored_choice_is_a_warning_and_measured_again(cache, tiny_verifier, tiny_draft, monkeypatch, capsys):
    monkeypatch.setattr(made, "MIN_DERIVED_BYTES", 0)
    verifier = _load(tiny_verifier)
    key = tuning.draft_variant_key(tiny_draft, verifier)
    tuning.tuning_path().parent.mkdir(parents=True, exist_ok=True)
    tuning.tuning_path().write_text(
        json.dumps({tuning.machine_id(): {key: {"choice": "q9_9", "candidates": [{"name": "q9_9"}]}}})
    )
    choice = made.choose(verifier, tiny_draft, AUTO, settings=SETTINGS)
    assert choice.candidates and "warning" in capsys.readouterr().err
    verifier.close()


def test_a_variant_by_name_is_announced_while_it_is_made_and_not_after(cache, tiny_verifier, tiny_draft):
    verifier = _load(tiny_verifier)
    said: list[str] = []
    first = made.choose(verifier, tiny_draft, Q4_0, settings=SETTINGS, announce=said.append)
    again = made.choose(verifier, tiny_draft, Q4_0, settings=SETTINGS, announce=said.append)
    assert said == ["making the q4_0 draft (once)"] and first == again and first.path.is_file()
    verifier.close()


def test_a_small_draft_is_used_as_given(tiny_verifier, tiny_draft):
    verifier = _load(tiny_verifier)
    choice = made.choose(verifier, tiny_draft, AUTO, settings=SETTINGS)
    assert (choice.variant, choice.path) == (ORIGINAL_VARIANT, tiny_draft)
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


@pytest.mark.parametrize("name", ["q3_x", "q4_0+"])  # "q4_0+" was a KeyError (issue 36)
def test_an_unknown_variant_is_one_line(cli, tiny_verifier, tiny_draft, name):
    result = cli("run", "-m", tiny_verifier, "-md", tiny_draft, "--draft-variant", name, "the")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"specgguf: error: --draft-variant must be one of auto, original, {', '.join(REQUANTIZATIONS)}, optionally"
        f" with +hot16k/hot32k/hot64k (e.g. q4_0+hot32k), not {name!r}"
    ]


def test_the_help_lists_the_variants_from_the_table(cli):
    result = cli("run", "--help")
    assert result.returncode == 0
    text = "".join(result.stdout.replace("│", "").split())  # Rich's panel wraps the help across lines
    assert all(name in text for name in REQUANTIZATIONS) and "+hot16k,+hot32k,+hot64k" in text


# --- a hot-vocabulary draft (files/hot_vocab.py, core/hot_vocab.py) ---
@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    """A tiny pair with a vocabulary large enough to cut (2048 tokens)."""
    folder = tmp_path_factory.mktemp("wide")
    verifier = write_tiny_llama(folder / "verifier.gguf", base_seed=7, n_vocab=2048)
    draft = write_tiny_llama(folder / "draft.gguf", base_seed=7, seed=1, noise=0.05, n_vocab=2048)
    return verifier, draft


def test_the_feed_map_reads_a_cold_token_as_its_longest_kept_prefix():
    tokens = ["a", "con", "config", "configuration", "zebra", "x"]
    ids = np.array([0, 1, 2, 5])  # "configuration" and "zebra" are cut
    feed = hot_vocab.feed_map(tokens, ids)
    assert feed.tolist() == [0, 1, 2, 2, 0, 3]  # "configuration" as "config"; "zebra" has no prefix: the first


def test_a_hot_vocabulary_file_loads_keeps_the_specials_and_scores_only_its_tokens(cache, wide_pair):
    _, draft = wide_pair
    path = hot_vocab.build(draft, cache / "hot.gguf", n_hot=1024)
    maps = hot_vocab.load_maps(path)
    ids, feed = maps.ids, maps.feed
    assert len(ids) == 1024 and {0, 1, 2} <= set(ids.tolist())  # unknown, BOS, EOS kept
    assert (ids[feed[ids]] == ids).all()  # a kept token is read as itself
    inner = LlamaModel(path, n_ctx=128, n_threads=1)
    assert inner.n_vocab == 1024
    original = LlamaModel(draft, n_ctx=128, n_threads=1)
    for token in (1, 2):
        assert inner.token_bytes(int(feed[token])) == original.token_bytes(token)
    model = HotVocab(inner, ids, feed)
    logits = model.eval([1, 300, 1500], n_logits=1)[0]
    assert logits.shape == (2048,) and np.isneginf(logits[np.setdiff1d(np.arange(2048), ids)]).all()
    assert np.isfinite(logits[ids]).all() and model.cached == [1, 300, 1500] and inner.n_past == 3
    assert model.is_eog(2) and not model.is_eog(1500)
    model.close()
    original.close()


def test_a_cold_token_in_the_context_is_fed_as_its_own_embedding_row(cache, wide_pair):
    """1500 is outside the hot set: fed as its row of the whole table, the cut draft scores its kept
    tokens as the uncut file does; read as its near-miss, it does not."""
    _, draft = wide_pair
    path = hot_vocab.build(draft, cache / "hot.gguf", n_hot=1024)
    maps = hot_vocab.load_maps(path)
    assert maps.rows is not None and 1500 not in set(maps.ids.tolist())
    original = LlamaModel(draft, n_ctx=128, n_threads=1)
    expected = original.eval([1, 300, 1500, 7], n_logits=2)[:, maps.ids]
    fed = HotVocab(LlamaModel(path, n_ctx=128, n_threads=1), maps.ids, maps.feed, maps.rows)
    fed.eval([1, 300], n_logits=1)  # all hot: read as tokens
    got = fed.eval([1500, 7], n_logits=2)[:, maps.ids]  # a cold one: the call as rows
    assert fed.n_fed_rows == 1 and fed.cached == [1, 300, 1500, 7]
    np.testing.assert_allclose(got, expected, atol=1e-3)
    near_miss = HotVocab(LlamaModel(path, n_ctx=128, n_threads=1), maps.ids, maps.feed)
    missed = near_miss.eval([1, 300, 1500, 7], n_logits=2)[:, maps.ids]
    assert near_miss.n_fed_rows == 0 and np.abs(missed - expected).max() > 1e-2
    for model in (original, fed, near_miss):
        model.close()


def test_a_hot_vocabulary_keeps_the_tokens_its_verifier_writes(cache, wide_pair, monkeypatch):
    """The verifier's greedy answers on the calibration set are counted once (kept in the cache
    folder), and every token they hold is in the hot set, whatever its id."""
    verifier = LlamaModel(wide_pair[0], n_ctx=1024, n_threads=1)
    counts = made.written_counts(verifier)
    assert counts.shape == (2048,) and 0 < counts.sum() <= len(made.HOT_CALIBRATION) * 96
    assert verifier.n_past == 0  # left as found
    monkeypatch.setattr(made, "_count_answers", lambda _verifier: pytest.fail("counted twice"))
    assert (made.written_counts(verifier) == counts).all()
    written = set(np.flatnonzero(counts).tolist())
    assert any(token >= 1024 for token in written)  # by id alone, some of them would be cut
    path = hot_vocab.build(wide_pair[1], cache / "hot.gguf", n_hot=1024, counts=counts)
    assert written <= set(hot_vocab.load_maps(path).ids.tolist())
    assert derived_path(wide_pair[1], "q4_0+hot16k", wide_pair[0]).name.endswith(
        f"-q4_0+hot16k-for-{verifier_id(wide_pair[0])}.gguf"
    )
    verifier.close()


def test_the_hot_set_ranks_what_the_verifier_wrote_before_the_lowest_ids():
    types = np.ones(10, dtype=np.int64)
    types[9] = 3  # a control token: always kept
    counts = np.zeros(10, dtype=np.int64)
    counts[[7, 8]] = [5, 2]
    assert hot_ids(types, 4).tolist() == [0, 1, 2, 9]
    assert hot_ids(types, 4, counts).tolist() == [0, 7, 8, 9]  # 7 and 8 were written, then id 0


def test_a_hot_vocabulary_draft_is_lossless(cache, wide_pair):
    """Greedy: every emitted token is the verifier's argmax for its context, though the draft cannot
    propose most of the vocabulary."""
    verifier_path, draft_path = wide_pair
    path = hot_vocab.build(draft_path, cache / "hot.gguf", n_hot=1024)
    verifier = RecordingModel(LlamaModel(verifier_path, n_ctx=256, n_threads=1))
    draft = made.open_draft(path, SETTINGS)
    tokens = verifier.tokenize("the cat was there", special=False)
    events = list(
        speculate(
            verifier=verifier,
            drafter=ModelDrafter(draft),
            prompt_tokens=tokens,
            k=4,
            max_tokens=40,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )
    )
    scored = {tuple(context): row for context, row in verifier.rows}
    context = list(tokens)
    for token in (t for event in events for t in event.tokens):
        assert token == int(np.argmax(scored[tuple(context)]))
        context.append(token)
    assert sum(event.n_drafted for event in events) > 0
    assert draft.cached == context[: draft.n_past]
    assert draft.n_fed_rows > 0  # cold tokens in the context went in as their own embedding rows
    verifier.model.close()
    draft.close()


def test_a_hot_vocabulary_draft_parked_and_restored_reads_on_as_if_it_never_moved(cache, wide_pair):
    """The cache slots' save_state/load_state through the hot view: the file's cache and the view's
    token list come back together, and the next row is the one an unmoved cache gives."""
    path = hot_vocab.build(wide_pair[1], cache / "hot.gguf", n_hot=1024)
    draft = made.open_draft(path, SETTINGS)
    assert isinstance(draft, HotVocab)
    cold = [token for token in range(3, 2048) if draft.ids[draft.feed[token]] != token][:4]
    context = [1, 40, *cold, 41, 42, 43]  # cold tokens in the cache: fed as their own embedding rows
    draft.eval(context[:-1], n_logits=0)
    state = draft.save_state()
    draft.rewind(0)
    draft.eval([1, 50, 51, 52], n_logits=0)  # another conversation
    draft.load_state(*state)
    assert draft.cached == context[:-1]
    restored = draft.eval(context[-1:], n_logits=1)
    draft.rewind(0)
    unmoved = draft.eval(context, n_logits=1)
    np.testing.assert_allclose(restored, unmoved, atol=1e-3)
    draft.close()


def test_a_damaged_id_map_is_one_clear_error(cache, wide_pair):
    path = hot_vocab.build(wide_pair[1], cache / "hot.gguf", n_hot=1024)
    np.savez(hot_vocab.sidecar(path), ids=np.array([5000]), feed=np.zeros(2048, dtype=np.int64))
    with pytest.raises(ModelLoadError, match="do not fit"):
        hot_vocab.load_maps(path)
    hot_vocab.build(wide_pair[1], cache / "hot.gguf", n_hot=1024)
    np.save(hot_vocab.rows_file(path), np.zeros((100, 8), dtype=np.uint8))
    with pytest.raises(ModelLoadError, match="100 rows for 2048 tokens"):
        hot_vocab.load_maps(path)
    np.save(hot_vocab.rows_file(path), np.zeros((2048, 8), dtype=np.float64))  # not rows as stored
    with pytest.raises(ModelLoadError, match="not an embedding table"):
        hot_vocab.load_maps(path)
    np.save(hot_vocab.rows_file(path), np.zeros((2048, 12), dtype=np.uint8))  # rows 3 wide, the model's are not
    with pytest.raises(ModelLoadError, match="rows of 3, not the model's"):
        made.open_draft(path, SETTINGS)


def test_hot_variants_are_named_by_size():
    variant = parse_variant("q4_0+hot32k")
    assert (variant.base, variant.n_hot, variant.name, str(variant)) == ("q4_0", 32768, "q4_0+hot32k", "q4_0+hot32k")
    assert parse_variant("original+hot16k") == Variant("original", 16) and not Variant("original", 16).is_original
    assert parse_request("auto") == AUTO and parse_request("original") == ORIGINAL_VARIANT
    for bad in ("q4_0+hot7k", "auto+hot32k", "q4_0+cold", "q4_0+", "+hot32k", "auto", "Q4_0", ""):
        with pytest.raises(UsageError, match="--draft-variant must be one of"):
            parse_variant(bad)


def test_every_requantization_names_types_llama_cpp_has():
    import llama_cpp

    for row in REQUANTIZATIONS.values():
        assert isinstance(getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{row.body}"), int)
        assert isinstance(getattr(llama_cpp, f"GGML_TYPE_{row.token_embedding}"), int)


def test_where_no_draft_can_beat_plain_decoding_the_original_is_kept():
    verify = (0.035, 0.06, 0.08, 0.1, 0.12)  # compute-bound: a batch of 5 is 3.4x one token
    hot = parse_variant("q4_0+hot32k")
    fast = tuning.Candidate(hot, 10.0, 0.81, 27.0)
    slow = tuning.Candidate(ORIGINAL_VARIANT, 21.8, 0.83, 22.0)
    assert made.pick([slow, fast], verify) == ORIGINAL_VARIANT  # 27 tok/s < 1 / 0.035 s = 28.6
    winning = tuning.Candidate(hot, 10.0, 0.81, 31.0)
    assert made.pick([slow, winning], verify) == hot


def test_a_draft_never_right_never_looks_faster_than_plain_on_a_noisy_verify_table():
    """Noise can make a batch of 2 rows measure cheaper than 1 (tiny models under load); priced on that
    table as it stands, a draft that is never right would look faster than plain decoding. The rate
    takes the table as never falling (MachineCosts.rising)."""
    noisy = MachineCosts((0.010, 0.008, 0.012, 0.014), draft=0.0001)
    assert noisy.rising().verify == (0.010, 0.010, 0.012, 0.014)
    assert expected_rate(noisy, 0.0) < 1.0 / noisy.verify[0]
    assert expected_rate(noisy, 0.9) > 1.0 / noisy.verify[0]  # a draft that is right still wins
