"""Ollama and LM Studio references, the draft found automatically, and `pairs --local`, over fake stores
built from real (tiny) GGUF files; hostile store contents get one line and a non-zero exit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fake_stores import MODEL_LAYER, add_lmstudio_model, add_ollama_model, place_blob, write_manifest
from live_server import live_server
from specgguf.drafts.found import vocab_match
from specgguf.files.gguf_header import SummaryIndex, summarize
from tiny_gguf import write_tiny_llama


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    """A verifier, a small and a large draft sharing its vocabulary, and a small one that does not."""
    folder = tmp_path_factory.mktemp("store-ggufs")
    return {
        "big": write_tiny_llama(folder / "big.gguf", base_seed=7, n_embd=128, n_layer=4),
        "small": write_tiny_llama(folder / "small.gguf", base_seed=7, n_embd=32, n_layer=1, n_head=2),
        "large": write_tiny_llama(folder / "large.gguf", base_seed=7, n_embd=96, n_layer=4),
        "other": write_tiny_llama(folder / "other.gguf", base_seed=7, n_embd=32, n_layer=1, n_head=2, vocab_type="bpe"),
    }


@pytest.fixture
def stores(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Empty Ollama store and LM Studio folder, and an empty specgguf cache: nothing else is local."""
    ollama, lmstudio = tmp_path / "ollama" / "models", tmp_path / "lmstudio" / "models"
    ollama.mkdir(parents=True)
    lmstudio.mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("SPECGGUF_LMSTUDIO_MODELS", str(lmstudio))
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    return ollama, lmstudio


def run_json(cli, *args):
    result = cli("run", *args, "-n", "6", "--temp", "0", "--seed", "1", "--json", "the cat")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_an_ollama_verifier_alone_runs_with_the_smallest_compatible_draft_from_the_store(cli, ggufs, stores):
    ollama, _ = stores
    verifier = add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_ollama_model(ollama, "tiny", "small", ggufs["small"])
    add_ollama_model(ollama, "tiny", "large", ggufs["large"])  # compatible, but not the smallest
    add_ollama_model(ollama, "other", "small", ggufs["other"])  # smaller still, another vocabulary
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert report["settings"]["model"] == str(verifier)
    assert report["settings"]["model_draft"] == str(draft)
    assert report["settings"]["drafter"] == "hybrid" and report["n_tokens"] == 6
    assert "draft: ollama:tiny:small" in stderr and "of the verifier" in stderr
    checked = cli("check", "ollama:tiny:small", "ollama:tiny:big")
    assert checked.returncode == 0 and "ollama:tiny:small" in checked.stdout and "sha256-" not in checked.stdout


def test_an_lmstudio_draft_is_found_for_an_ollama_verifier_and_named_by_reference(cli, ggufs, stores):
    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    draft = add_lmstudio_model(lmstudio, "tiny-publisher", "Tiny-GGUF", ggufs["small"])
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert report["settings"]["model_draft"] == str(draft)
    assert "lmstudio:tiny-publisher/Tiny-GGUF/small.gguf" in stderr
    # and given by reference, in both roles
    report, _ = run_json(cli, "-m", "ollama:library/tiny:big", "-md", "lmstudio:tiny-publisher/Tiny-GGUF/small.gguf")
    assert report["settings"]["model_draft"] == str(draft)


@pytest.mark.qwen
def test_the_default_pair_placed_in_an_ollama_store_runs_with_its_draft_found(cli, qwen_pair, stores):
    ollama, _ = stores
    verifier, draft = qwen_pair
    add_ollama_model(ollama, "qwen2.5-coder", "1.5b", verifier)
    blob = add_ollama_model(ollama, "qwen2.5-coder", "0.5b", draft)
    # The original draft file: making and measuring its variants (tests/test_draft_variant.py) would
    # take half a minute here, since an empty cache holds none and the blob's name is a new tuning key.
    args = ("-m", "ollama:qwen2.5-coder:1.5b", "--draft-variant", "original", "-n", "8", "--temp", "0", "--json")
    result = cli("run", *args, "def add(a, b):")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["model_draft"] == str(blob) and report["settings"]["pair"] == "qwen2.5-coder-1.5b"
    assert report["settings"]["drafter"] == "hybrid" and report["n_tokens"] == 8
    assert "draft: ollama:qwen2.5-coder:0.5b (the registry pairs this verifier with Qwen/" in result.stderr


def test_serve_names_an_ollama_model_as_ollama_does_and_drafts_with_the_draft_found(ggufs, stores):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "tiny", "small", ggufs["small"])
    with live_server("-m", "ollama:tiny:big", "-c", "256", "-t", "1", "-n", "8") as server:
        client = server.client(api_key="none")
        assert [model.id for model in client.models.list()] == ["tiny:big"]
        answer = client.chat.completions.create(
            model="tiny:big",
            messages=[{"role": "user", "content": "the cat"}],
            extra_body={"speculative": {"drafter": "model", "k": 2}},  # a 400 if no draft model were loaded
        )
        assert answer.choices[0].message.content and answer.model == "tiny:big"
        assert server.metric("specgguf_tokens_drafted_total") > 0


def test_without_a_compatible_draft_it_drafts_with_ngrams_alone_and_says_so(cli, ggufs, stores):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    # The one of another vocabulary is tried first (measured: these random tiny models never agree, so
    # n-gram drafts alone win; tests/test_cross_search.py forces both outcomes), then passed over.
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert report["settings"]["drafter"] == "ngram" and report["settings"]["model_draft"] is None
    assert "ollama:other:small: other vocabulary" in stderr
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert report["settings"]["drafter"] == "ngram" and report["settings"]["model_draft"] is None
    stderr = " ".join(stderr.split())
    assert "none of the 1 local models shares the verifier's vocabulary" in stderr
    assert "n-grams alone" in stderr and "measured here slower" in stderr


def test_a_registry_verifier_without_its_draft_here_is_told_which_pull_fetches_it(cli, ggufs, stores, config_home):
    (config_home / "specgguf" / "models.yaml").write_text(
        "pairs:\n  tiny:\n    note: n\n    license: mit\n    recommended_k: 4\n"
        "    verifier: {repo: me/Big-GGUF, file: big.gguf}\n    draft: {repo: me/Small-GGUF, file: small.gguf}\n"
    )
    report, stderr = run_json(cli, "-m", ggufs["big"])
    assert report["settings"]["drafter"] == "ngram"
    assert "`specgguf pull tiny` fetches its registry draft" in " ".join(stderr.split())


def test_a_compatible_draft_too_large_to_pay_is_named_not_used(cli, ggufs, stores):
    ollama, _ = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "tiny", "large", ggufs["large"])
    report, stderr = run_json(cli, "-m", "ollama:tiny:big")
    assert report["settings"]["drafter"] == "ngram"
    assert "ollama:tiny:large, is" in stderr and "-md ollama:tiny:large" in stderr


def test_pairs_local_lists_every_compatible_pair_with_sizes_ratio_and_command(cli, ggufs, stores):
    ollama, lmstudio = stores
    add_ollama_model(ollama, "tiny", "big", ggufs["big"])
    add_ollama_model(ollama, "other", "small", ggufs["other"])
    add_lmstudio_model(lmstudio, "pub", "Tiny-GGUF", ggufs["small"])
    write_manifest(ollama, "hostile", "x", [{"mediaType": MODEL_LAYER, "digest": "sha256:../../x", "size": 1}])
    result = cli("pairs", "--local", "--json")
    assert result.returncode == 0, result.stderr
    (pair,) = [row for row in json.loads(result.stdout) if row["vocabulary"] == "same"]  # then another's
    assert pair["verifier"] == "ollama:tiny:big" and pair["draft"] == "lmstudio:pub/Tiny-GGUF/small.gguf"
    assert pair["draft_bytes"] == ggufs["small"].stat().st_size
    assert pair["ratio"] == pytest.approx(ggufs["small"].stat().st_size / ggufs["big"].stat().st_size, abs=1e-4)
    assert pair["command"] == "specgguf run -m ollama:tiny:big -md lmstudio:pub/Tiny-GGUF/small.gguf"
    table = cli("pairs", "--local")
    assert table.returncode == 0 and "ollama:tiny:big" in table.stdout and "specgguf run -m" in table.stdout


def test_lmstudio_folder_comes_from_its_settings(tmp_path, monkeypatch, ggufs):
    from specgguf.files import lmstudio

    monkeypatch.delenv("SPECGGUF_LMSTUDIO_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lmstudio.store_root() == tmp_path / ".lmstudio" / "models"
    elsewhere = tmp_path / "disk" / "models"
    (tmp_path / ".lmstudio").mkdir()
    (tmp_path / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(elsewhere)}))
    assert lmstudio.store_root() == elsewhere
    add_lmstudio_model(elsewhere, "p", "r", ggufs["small"])
    assert lmstudio.resolve("lmstudio:p/r") == elsewhere / "p" / "r" / "small.gguf"  # the one model file there
    moved = tmp_path / "moved-home"
    moved.mkdir()
    (tmp_path / ".lmstudio-home-pointer").write_text(str(moved) + "\n")  # LM Studio's home, moved
    assert lmstudio.store_root() == moved / "models"
    monkeypatch.setenv("SPECGGUF_LMSTUDIO_MODELS", str(tmp_path / "mine"))
    assert lmstudio.store_root() == tmp_path / "mine"


# --- hostile store contents -----------------------------------------------------------------
def _outside(tmp_path: Path, gguf: Path) -> Path:
    target = tmp_path / "outside.gguf"
    target.write_bytes(gguf.read_bytes())
    return target


HOSTILE_OLLAMA = {
    "dot-dot digest": (lambda s, g, t: [_layer("sha256:../../../outside.gguf", 1)], "not sha256:<64 hex>"),
    "short digest": (lambda s, g, t: [_layer("sha256:abc", 1)], "not sha256:<64 hex>"),
    "wrong media type": (
        lambda s, g, t: [{**_layer(place_blob(s, g), g.stat().st_size), "mediaType": "application/x-tensor"}],
        "has no GGUF model layer",
    ),
    "missing blob": (lambda s, g, t: [_layer("sha256:" + "a" * 64, 10)], "is missing from"),
    "wrong size": (lambda s, g, t: [_layer(place_blob(s, g), 5)], "the store is damaged"),
    "no size": (lambda s, g, t: [{"mediaType": MODEL_LAYER, "digest": place_blob(s, g)}], "no valid size"),
    "blob links out": (lambda s, g, t: [_linked_out(s, g, t)], "leads outside the Ollama store"),
    "not a GGUF": (lambda s, g, t: [_layer(place_blob(s, t / "x.txt"), 4)], "is not a GGUF file"),
    "adapter": (
        lambda s, g, t: [
            _layer(place_blob(s, g), g.stat().st_size),
            {**_layer(place_blob(s, g), 1), "mediaType": "application/vnd.ollama.image.adapter"},
        ],
        "LoRA adapter",
    ),
    "layers not a list": (lambda s, g, t: {"layers": "x"}, "no list of layers"),
}


def _layer(digest: str, size: int) -> dict:
    return {"mediaType": MODEL_LAYER, "digest": digest, "size": size}


def _linked_out(store: Path, gguf: Path, tmp_path: Path) -> dict:
    outside = _outside(tmp_path, gguf)
    digest = "e" * 64
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    (store / "blobs" / f"sha256-{digest}").symlink_to(outside)
    return _layer(f"sha256:{digest}", outside.stat().st_size)


@pytest.mark.parametrize("case", sorted(HOSTILE_OLLAMA))
def test_hostile_ollama_manifests_get_one_line(cli, ggufs, stores, tmp_path, case):
    ollama, _ = stores
    (tmp_path / "x.txt").write_text("text")
    build, expected = HOSTILE_OLLAMA[case]
    layers = build(ollama, ggufs["small"], tmp_path)
    path = write_manifest(ollama, "evil", "latest", layers if isinstance(layers, list) else [])
    if isinstance(layers, dict):
        path.write_text(json.dumps(layers))
    line = cli("run", "-m", "ollama:evil", "hi").error_line()
    assert expected in line, line
    assert cli("check", "ollama:evil", "ollama:evil").returncode == 2


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("ollama:../../etc/passwd", "is not an Ollama model name"),
        ("ollama:a/b/c/d", "is not an Ollama model name"),
        ("ollama:.hidden", "breaks Ollama's naming rules"),
        ("ollama:absent:tag", "is not in the Ollama store"),
        ("lmstudio:../outside/x.gguf", "is not an LM Studio model"),
        ("lmstudio:p/r/absent.gguf", "is not in LM Studio's folder"),
        ("lmstudio:p", "is not an LM Studio model"),
    ],
)
def test_bad_references_get_one_line(cli, stores, reference, expected):
    line = cli("run", "-m", reference, "hi").error_line()
    assert expected in line, line


def test_a_manifest_linked_out_of_the_store_is_not_followed(cli, ggufs, stores, tmp_path):
    ollama, _ = stores
    elsewhere = tmp_path / "elsewhere"
    write_manifest(elsewhere, "evil", "latest", [_layer(place_blob(elsewhere, ggufs["small"]), 1)])
    (ollama / "manifests" / "registry.ollama.ai" / "library").mkdir(parents=True)
    (ollama / "manifests" / "registry.ollama.ai" / "library" / "evil").symlink_to(
        elsewhere / "manifests" / "registry.ollama.ai" / "library" / "evil"
    )
    assert "leads outside the Ollama store" in cli("run", "-m", "ollama:evil", "hi").error_line()


def test_lmstudio_links_out_of_the_folder_are_refused(cli, ggufs, stores, tmp_path):
    _, lmstudio = stores
    (lmstudio / "p" / "r").mkdir(parents=True)
    (lmstudio / "p" / "r" / "x.gguf").symlink_to(_outside(tmp_path, ggufs["small"]))
    (lmstudio / "p" / "r" / "fake.gguf").write_text("not a model")
    assert "leads outside LM Studio's folder" in cli("run", "-m", "lmstudio:p/r/x.gguf", "hi").error_line()
    assert "is not a GGUF file" in cli("run", "-m", "lmstudio:p/r/fake.gguf", "hi").error_line()


# --- the fingerprint decides as llama.cpp does ------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "compatible"),
    [
        ({}, True),
        ({"n_vocab": 1521 + 100}, True),  # padded: sizes within 128
        ({"n_vocab": 1521 + 200}, False),
        ({"token_text_override": {3: "zz"}}, True),  # below id 5: not compared
        ({"token_text_override": {700: "zz"}}, False),
        ({"token_text_override": {1500: "zz"}}, False),  # in the tail
        ({"eos_id": 1}, False),
        ({"vocab_type": "bpe"}, False),
    ],
)
def test_the_fingerprint_agrees_with_llama_cpps_check(tmp_path, ggufs, variant, compatible):
    from specgguf.llama.compat import compare_vocabularies
    from specgguf.llama.vocab import read_vocab

    draft = write_tiny_llama(tmp_path / "draft.gguf", n_embd=32, n_layer=1, n_head=2, **variant)
    by_llama = all(f.ok for f in compare_vocabularies(read_vocab(ggufs["big"])[0], read_vocab(draft)[0]))
    assert by_llama == compatible
    assert vocab_match(summarize(ggufs["big"]), summarize(draft)) == compatible


def test_summaries_are_kept_and_a_changed_file_is_read_again(tmp_path, monkeypatch, ggufs):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(ggufs["small"].read_bytes())
    index = SummaryIndex()
    first = index.get(model)
    index.save()
    assert SummaryIndex().get(model) == first and not SummaryIndex().changed
    model.write_bytes(ggufs["other"].read_bytes())
    os.utime(model, ns=(1, 1))
    again = SummaryIndex()
    assert again.get(model).tokenizer == "gpt2" and again.changed
