"""The maps are true to the code: each wing's `__init__.py` and docs/modules.md name every module, and
every `.py` file a docstring, comment or doc names exists (STYLE.md 27: when a file moves, its old
name goes from the comments and docs in the same commit)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specgguf"
WINGS = sorted(path.parent for path in PACKAGE.glob("*/__init__.py"))


def _modules(folder: Path) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("wing", WINGS, ids=lambda wing: wing.name)
def test_each_wings_map_names_every_module_in_it(wing):
    text = (wing / "__init__.py").read_text(encoding="utf-8")
    assert [name for name in _modules(wing) if not re.search(rf"\b{name}\b", text)] == []


def test_the_module_map_names_every_module():
    text = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    folders = [PACKAGE, *WINGS]
    missing = [
        f"{folder.name}/{name}"
        for folder in folders
        for name in _modules(folder)
        if not re.search(rf"\b{name}\.py\b", text)
    ]
    assert missing == []


def _prose(path: Path) -> list[tuple[int, str]]:
    """A module's comments and docstrings, with their line numbers."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and token.string.startswith('"""')):
            found.append((token.start[0], token.string))
    return found


def test_every_python_file_named_in_prose_exists():
    files = {path.name for folder in ("specgguf", "tests", "scripts") for path in (ROOT / folder).rglob("*.py")}
    texts = [
        (f"{path.relative_to(ROOT)}:{line}", text) for path in PACKAGE.rglob("*.py") for line, text in _prose(path)
    ]
    texts += [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")) for path in (ROOT / "docs").glob("*.md")]
    texts.append(("README.md", (ROOT / "README.md").read_text(encoding="utf-8")))
    # (A file an example request sends, `"filename": "x.py"`, is the example's, not a reference.)
    named = [(where, name) for where, text in texts for name in re.findall(r'(?<!"filename": ")\b(\w+\.py)\b', text)]
    assert [(where, name) for where, name in named if name not in files] == []
