"""The registry: the shipped pairs, strict validation with file:line messages, user overrides, `pairs`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specgguf.files.registry import RegistryError, load_registry, parse_model_ref, parse_registry

SHA = "ab" * 32

GOOD = """\
pairs:
  mine:
    note: "a test pair"
    license: mit
    recommended_k: 4
    verifier:
      repo: someone/big-GGUF
      file: big.gguf
      size: 1000
      sha256: {sha}
    draft:
      repo: someone/small-GGUF
      file: small.gguf
"""


def test_the_shipped_registry_covers_the_families_people_run():
    registry = load_registry()
    assert registry.default == "qwen2.5-coder-1.5b"
    expected = {
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-7b",
        "qwen2.5-coder-14b",
        "qwen2.5-coder-32b",
        "qwen2.5-7b",
        "qwen2.5-14b",
        "qwen2.5-32b",
        "qwen2.5-72b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "llama3.1-8b",
        "llama3.3-70b",
        "gemma3-4b",
        "gemma3-12b",
        "gemma3-27b",
    }
    assert expected <= set(registry.pairs)
    for pair in registry.pairs.values():
        assert pair.note and pair.license and 1 <= pair.recommended_k <= 16
        assert pair.verifier.repo != pair.draft.repo
        for model in (pair.verifier, pair.draft):
            assert model.file.lower().endswith(".gguf") and model.repo.count("/") == 1
    # A split GGUF lists every part, with sizes that add up.
    qwen72 = registry.get("qwen2.5-72b").verifier
    assert len(qwen72.files()) == 12 and qwen72.total_size == 44_010_465_472
    assert all(part.sha256 for part in qwen72.files())
    # The offline default pair installs from PyPI and is pinned by SHA-256.
    default = registry.get(registry.default)
    assert default.verifier.pypi and default.draft.pypi and default.verifier.sha256 and default.draft.sha256


def test_a_valid_file_parses_into_objects():
    pairs, default = parse_registry(GOOD.format(sha=SHA), "mine.yaml")
    pair = pairs["mine"]
    assert default is None and pair.recommended_k == 4 and pair.verifier.sha256 == SHA
    assert pair.verifier.ref == "someone/big-GGUF/big.gguf" and pair.draft.size is None
    assert pair.draft.revision is None and pair.draft.confirmed


BAD_FILES = {
    "unknown key": (
        GOOD.replace("    license: mit\n", "    licence: mit\n"),
        "mine.yaml:4: pair 'mine': unknown key 'licence'",
    ),
    "unknown nested key": (
        GOOD.replace("      size: 1000\n", "      bytes: 1000\n"),
        "mine.yaml:9: pair 'mine'.verifier: unknown key 'bytes'",
    ),
    "missing field": (GOOD.replace("    recommended_k: 4\n", ""), "pair 'mine': missing required key 'recommended_k'"),
    "missing nested field": (
        GOOD.replace("      file: small.gguf\n", ""),
        "pair 'mine'.draft: missing required key 'file'",
    ),
    "wrong type": (
        GOOD.replace("recommended_k: 4", "recommended_k: four"),
        "mine.yaml:5: pair 'mine'.recommended_k: expected int, got str 'four'",
    ),
    "bool is not an int": (GOOD.replace("size: 1000", "size: true"), "pair 'mine'.verifier.size: expected int"),
    "bad sha256": (GOOD.replace("sha256: {sha}", "sha256: 1234"), "mine.yaml:10: pair 'mine'.verifier.sha256"),
    "not a gguf": (GOOD.replace("file: big.gguf", "file: big.bin"), "pair 'mine'.verifier.file: expected a .gguf"),
    "bad repo": (GOOD.replace("repo: someone/small-GGUF", "repo: small-GGUF"), "pair 'mine'.draft.repo"),
    "K out of range": (GOOD.replace("recommended_k: 4", "recommended_k: 500"), "must be between 0 and 64"),
    "shards not a list": (
        GOOD.replace("      size: 1000\n", "      shards: big-2.gguf\n"),
        "pair 'mine'.verifier.shards: expected a list",
    ),
    "pypi without sha256": (
        GOOD.replace(
            "      file: small.gguf\n",
            "      file: small.gguf\n      pypi: {{package: 'p{{n}}', parts: 2, version: '1'}}\n",
        ),
        "pair 'mine'.draft: 'pypi' needs 'sha256'",
    ),
    "not YAML": ("pairs: [unclosed", "mine.yaml: not valid YAML"),
    "pairs not a mapping": ("pairs: [a, b]\n", "mine.yaml:1: 'pairs' must be a mapping"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_validation_names_the_file_the_pair_and_the_key(case):
    text, expected = BAD_FILES[case]
    with pytest.raises(RegistryError) as raised:
        parse_registry(text.format(sha=SHA), "mine.yaml")
    assert expected in str(raised.value)


def test_model_references():
    model = parse_model_ref("bartowski/Llama-3.2-1B-Instruct-GGUF/sub/Llama-3.2-1B-Instruct-Q4_K_M.gguf")
    assert model.repo == "bartowski/Llama-3.2-1B-Instruct-GGUF" and model.file.startswith("sub/")
    for bad in ("just-a-file.gguf", "owner/repo", "owner/repo/file.bin", "owner//file.gguf"):
        with pytest.raises(RegistryError, match="OWNER/REPO/FILE.gguf"):
            parse_model_ref(bad)


@pytest.fixture
def user_config(config_home, tmp_path, monkeypatch):
    """A user registry that adds a pair and overrides a shipped one."""
    override = textwrap.dedent("""\
      qwen2.5-coder-7b:
        note: "my own 7B pairing"
        license: apache-2.0
        recommended_k: 3
        verifier: {repo: me/Qwen2.5-Coder-7B-GGUF, file: q7.gguf}
        draft: {repo: me/Qwen2.5-Coder-0.5B-GGUF, file: q05.gguf, confirmed: false}
    """)
    (config_home / "specgguf" / "models.yaml").write_text(
        GOOD.format(sha=SHA) + textwrap.indent(override, "  ") + "default: mine\n"
    )
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))


def test_a_user_file_adds_and_overrides_pairs(cli, user_config):
    result = cli("pairs")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "mine" in rows and "qwen3-8b" in rows  # added, and the shipped ones stay
    assert rows["mine"].split()[1] == "*"  # the user's default
    assert " 3 " in rows["qwen2.5-coder-7b"] and "!" in rows["qwen2.5-coder-7b"]  # overridden, unconfirmed
    details = cli("pairs", "qwen2.5-coder-7b")
    assert "my own 7B pairing" in details.stdout and "me/Qwen2.5-Coder-7B-GGUF/q7.gguf" in details.stdout
    assert "not confirmed against a source" in details.stdout


def test_pairs_shows_what_is_here_and_what_was_measured(cli, user_config):
    from specgguf.tuning import BenchResult, store_measurement

    store_measurement(Path("big.gguf"), Path("small.gguf"), 0.0, BenchResult(4, 1.8, 0.75))
    result = cli("pairs")
    row = next(line for line in result.stdout.splitlines() if line.startswith("mine"))
    assert "75%, 1.80x, K=4" in row and "no" in row.split()  # measured, not downloaded
    assert "0.00+?" in row  # the verifier's size from the registry; the draft's is unknown


def test_a_broken_user_file_is_one_line_naming_file_line_pair_and_key(cli, config_home):
    folder = config_home / "specgguf"
    (folder / "models.yaml").write_text(GOOD.format(sha=SHA).replace("license:", "licence:"))
    for args in (["pairs"], ["pull", "mine"], ["run", "--pair", "mine", "hi"]):
        result = cli(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
        assert lines[0] == (
            f"specgguf: error: {folder / 'models.yaml'}:4: pair 'mine': unknown key 'licence'"
            " (allowed: verifier, draft, recommended_k, license, note)"
        )
