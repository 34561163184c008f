"""No `isinstance` on a K policy class outside core/kpolicy.py (STYLE.md 29): what a caller needs from a
policy is a method of the `KPolicy` protocol (core/engine.py), which every policy answers. The policy
classes are found, not listed: every class of the package with `choose` and `keep_drafting`. A planted
violation in a copy of a module is flagged."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specgguf"
ALLOWED = PACKAGE / "core" / "kpolicy.py"  # the module that defines the adaptive policies


def policy_classes(package: Path = PACKAGE) -> set[str]:
    """The names of the package's classes that implement the K policy protocol."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
                if {"choose", "keep_drafting"} <= methods:
                    names.add(node.name)
    return names


def _named(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [name for element in node.elts for name in _named(element)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.BinOp):  # isinstance(x, A | B)
        return _named(node.left) + _named(node.right)
    return []


def dispatches(source: str, classes: set[str]) -> list[tuple[int, str]]:
    """(line, class) for each isinstance call in `source` that names one of `classes`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "isinstance" and len(node.args) == 2:
            found += [(node.lineno, name) for name in _named(node.args[1]) if name in classes]
    return found


def test_the_policy_classes_are_found():
    assert {"FixedK", "AdaptiveK", "PerSource"} <= policy_classes()


def test_no_isinstance_on_a_policy_class_outside_kpolicy():
    classes = policy_classes()
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ALLOWED and (hits := dispatches(path.read_text(encoding="utf-8"), classes))
    }
    assert found == {}


def test_a_planted_dispatch_is_flagged(tmp_path):
    original = (PACKAGE / "serve" / "plan.py").read_text(encoding="utf-8")
    planted = tmp_path / "plan.py"
    planted.write_text(
        original + "\n\ndef _planted(policy):\n    return isinstance(policy, (FixedK, kpolicy.AdaptiveK))\n"
    )
    assert dispatches(original, policy_classes()) == []
    line = len(planted.read_text(encoding="utf-8").splitlines())
    assert dispatches(planted.read_text(encoding="utf-8"), policy_classes()) == [(line, "FixedK"), (line, "AdaptiveK")]
