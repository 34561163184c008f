"""Each test's kind, for the test loop: `unit`, `gguf` or `live` (docs: README.md, Tests).

- `live`: starts another process: a `specgguf serve` (tests/live_server.py), the command as a real
  process (`cli.process`), a `specgguf worker`, a program the code under test runs;
- `gguf`: loads a GGUF file in this process, generated (tiny_gguf.py) or real (SmolLM2, Gemma, Qwen);
- `unit`: neither: in this process, fake models, numbers and text (`make test-unit`).

A test gets its kind from what it uses, at collection: a fixture in GGUF_FIXTURES (or a parameter naming
one, for `request.getfixturevalue`), or source (the test
function's, its fixtures' or their helpers' in the same module) that calls one of LIVE_CALLS or GGUF_CALLS.
Where that cannot see it (the code under test starts a program), the test carries the mark itself. The guard
checks it as the test runs: a `unit` test that loads a model or starts a process, or a `gguf` test that
starts specgguf, fails and says which mark it needs.
conftest.py imports the two hooks; tests/test_kinds.py plants tests that break the rules.
"""

from __future__ import annotations

import inspect
import platform
import subprocess

import pytest

KINDS = ("unit", "gguf", "live")
GGUF_FIXTURES = frozenset({"tiny_verifier", "tiny_draft", "smollm2", "qwen_pair", "gemma270m"})
LIVE_CALLS = ("live_server(", ".process(", "subprocess.", "Popen(")
GGUF_CALLS = ("write_tiny_llama(",)


_SOURCES: dict = {}  # function -> its source: a fixture or helper is read once, not once per test that uses it


def _source(function) -> str:
    if function not in _SOURCES:
        try:
            _SOURCES[function] = inspect.getsource(function)
        except (OSError, TypeError):
            _SOURCES[function] = ""
    return _SOURCES[function]


def _helpers(function, seen: set) -> list:
    """The function, the functions of its own module that it names (theirs in turn), and the classes it names
    that a test module defines (not conftest's `Cli`: calling it is in-process; `.process(` is not)."""
    code = getattr(function, "__code__", None)
    if code is None or function in seen:
        return []
    seen.add(function)
    names, stack = set(), [code]
    while stack:  # the names in nested functions and comprehensions too
        current = stack.pop()
        names.update(current.co_names)
        stack += [const for const in current.co_consts if inspect.iscode(const)]
    found = [function]
    for name in names:
        value = function.__globals__.get(name)
        if inspect.isfunction(value) and value.__module__ == function.__module__:
            found += _helpers(value, seen)
        elif (
            inspect.isclass(value) and value.__module__ == function.__module__ and value.__module__.startswith("test_")
        ):
            found.append(value)  # a class a test module keeps (a worker process, say)
    return found


def _sources(item: pytest.Function) -> list[str]:
    """The source of the test function, of every fixture it uses (directly or through other fixtures), and of
    the helpers in tests/ they call."""
    functions = [item.function]
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        functions += [definition.func for definition in definitions if definition.func.__module__ != __name__]
    seen: set = set()
    return [_source(helper) for function in functions for helper in _helpers(function, seen)]


def _params(item: pytest.Function) -> list:
    callspec = getattr(item, "callspec", None)
    return list(callspec.params.values()) if callspec is not None else []


def kind_of(item: pytest.Item) -> str:
    """The kind a test's marks give it, or the one found from what it uses."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in KINDS}
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: marked {' and '.join(sorted(marked))}; a test has one kind")
    if marked:
        return marked.pop()
    if not isinstance(item, pytest.Function):
        return "unit"
    sources = _sources(item)
    if any(call in source for source in sources for call in LIVE_CALLS):
        return "live"
    # a fixture by name, or one named by a parameter (`request.getfixturevalue(model_file)`)
    used = set(item.fixturenames) | {value for value in _params(item) if isinstance(value, str)}
    if GGUF_FIXTURES & used or any(call in source for source in sources for call in GGUF_CALLS):
        return "gguf"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = kind_of(item)
        if not item.get_closest_marker(kind):
            item.add_marker(kind)


def _refused(what: str, kind: str, needed: str):
    return f"this test {what}, but its kind is `{kind}`: mark it `@pytest.mark.{needed}` (tests/kinds.py)"


def _is_specgguf(args) -> bool:
    """`python -m specgguf ...`: the command itself (run, serve, worker), not a child it starts for itself."""
    command = [str(arg) for arg in args] if isinstance(args, (list, tuple)) else [str(args)]
    return command[1:3] == ["-m", "specgguf"]


@pytest.fixture(autouse=True)
def _kind_guard(request, monkeypatch):
    """A test does no more than its kind says: a `unit` test loads no model and starts no process; a `gguf`
    test does not start specgguf (a child specgguf starts for itself, such as the grammar checker, is its own)."""
    kind = next((name for name in KINDS if request.node.get_closest_marker(name)), "unit")
    if kind == "live":
        return
    platform.processor()  # `uname -p`, once, cached: not this test's process
    start = subprocess.Popen.__init__

    def guarded_start(self, args, *more, **options):
        if kind == "unit" or _is_specgguf(args):
            pytest.fail(_refused(f"starts a process ({args!r:.80})", kind, "live"))
        start(self, args, *more, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_start)
    if kind == "unit":
        import llama_cpp

        def refused_load(*_args, **_kwargs):
            pytest.fail(_refused("loads a GGUF model", kind, "gguf"))

        monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", refused_load)
