"""The layer rules in pyproject.toml hold, and a planted violation of each breaks them.

`make lint` runs `lint-imports` over the package; here it runs over a copy of the package
with one import planted, to show that the contracts catch what they say they catch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (`make install`)")


def lint_copy(tmp_path: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the package, with `plant` = (module file, import line) added."""
    shutil.copytree(ROOT / "specgguf", tmp_path / "specgguf", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if plant is not None:
        module, line = plant
        path = tmp_path / "specgguf" / module
        path.write_text(path.read_text() + f"\n{line}  # planted\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the copy, not the installed package
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_package_keeps_every_contract(tmp_path):
    result = lint_copy(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # an arrow back up: the algorithm reaching for the terminal
        ("core/engine.py", "from ..cli import render", "cli over serve|bench"),
        # two wings of one floor: the model files wing using the algorithm
        ("files/registry.py", "from ..core import sampling", "cli over serve|bench"),
        # llama.cpp outside llama/
        ("serve/generator.py", "import llama_cpp", "nothing outside llama/ imports llama_cpp"),
        # the algorithm with a terminal library
        ("core/sampling.py", "import rich", "core/ is the algorithm"),
        # one API reaching into another's module
        ("serve/apis/infill.py", "from . import embeddings", "the server's APIs import none of each other"),
        # the server's machinery knowing an API
        ("serve/jobs.py", "from .apis.openai import bodies", "the server's machinery imports no API"),
        # the server reaching past the policy protocol into the policies or the cost model
        ("serve/plan.py", "from ..core import kpolicy", "serve/ imports no core.kpolicy or core.costs"),
        ("serve/generator.py", "from ..core.costs import StepCosts", "serve/ imports no core.kpolicy or core.costs"),
        # the drafts wing: a room of its lower floor asking another, and set-up below it reaching up
        ("drafts/made.py", "from . import found", "drafts/: cross_search over found|made|cross_vocab"),
        ("drafts/found.py", "from .cross_search import Trial", "drafts/: cross_search over found|made|cross_vocab"),
        ("tuning.py", "from .drafts import made", "cli over serve|bench over prepare over drafts"),
        ("kchoice.py", "from .drafts.made import DraftChoice", "cli over serve|bench over prepare over drafts"),
        # an import circle in serve/: common is below jobs
        ("serve/common.py", "from . import jobs", "no import circle"),
    ],
)
def test_a_planted_violation_fails(tmp_path, module, line, broken):
    result = lint_copy(tmp_path, (module, line))
    assert result.returncode != 0
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout
    planted = module.replace("/", ".").removesuffix(".py")
    # The planted import is the one named (a circle's report names a package's children relatively: ".common").
    assert planted in result.stdout or f".{planted.rsplit('.', 1)[1]} " in result.stdout


def test_a_planted_circle_fails(tmp_path):
    """The grammar's protocol reaching back for the drafts that read it (the circle core/ had)."""
    result = lint_copy(tmp_path, ("core/constraint.py", "from .drafting import Drafts"))
    assert result.returncode != 0
    assert "no import circle" in result.stdout and "BROKEN" in result.stdout
    assert "No cycles are allowed in specgguf.core" in result.stdout
