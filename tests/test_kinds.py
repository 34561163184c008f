"""Every test gets one kind (tests/kinds.py): planted tests are marked by what they use, and one that does
more than its kind says fails, naming the mark it needs."""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest
from kinds import _kind_guard, pytest_collection_modifyitems

@pytest.fixture
def tiny_verifier(tmp_path):
    return tmp_path / "verifier.gguf"

@pytest.fixture
def server():
    from live_server import live_server
    with live_server("-m", "x.gguf") as started:
        yield started
"""

PLANTED = """
import subprocess
import sys

import pytest

def test_numbers():
    assert 1 + 1 == 2

def test_a_model(tiny_verifier):
    pass

def test_a_server(server):
    pass

def _run_the_command():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_a_helper_that_starts_a_process():
    _run_the_command()

def test_a_hidden_process():
    getattr(subprocess, "run")([sys.executable, "-c", "pass"], check=True)

def test_a_hidden_model():
    import llama_cpp
    getattr(llama_cpp, "llama_model_load_from_file")(b"/nowhere.gguf", llama_cpp.llama_model_default_params())

@pytest.mark.gguf
def test_a_model_that_starts_specgguf():
    getattr(subprocess, "run")([sys.executable, "-m", "specgguf", "--version"], check=True)

@pytest.mark.live
def test_marked_live():
    getattr(subprocess, "run")([sys.executable, "-c", "pass"], check=True)
"""


def _plant(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_planted=PLANTED)


def _selected(pytester: pytest.Pytester, kind: str) -> set[str]:
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q", "-m", kind)
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_each_test_is_marked_by_what_it_uses(pytester):
    _plant(pytester)
    assert _selected(pytester, "unit") == {"test_numbers", "test_a_hidden_process", "test_a_hidden_model"}
    assert _selected(pytester, "gguf") == {"test_a_model", "test_a_model_that_starts_specgguf"}
    assert _selected(pytester, "live") == {"test_a_server", "test_a_helper_that_starts_a_process", "test_marked_live"}


def test_a_test_that_does_more_than_its_kind_fails_naming_the_mark(pytester):
    _plant(pytester)
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "not live", "-k", "hidden or numbers or specgguf")
    result.assert_outcomes(passed=1, failed=3)  # test_numbers passes
    result.stdout.fnmatch_lines(["*starts a process*its kind is `unit`: mark it `@pytest.mark.live`*"])
    result.stdout.fnmatch_lines(["*loads a GGUF model, but its kind is `unit`: mark it `@pytest.mark.gguf`*"])
    result.stdout.fnmatch_lines(["*starts a process*its kind is `gguf`: mark it `@pytest.mark.live`*"])


def test_two_kinds_on_one_test_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_two="import pytest\n\n@pytest.mark.unit\n@pytest.mark.live\ndef test_both():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*test_both: marked live and unit; a test has one kind*"])
