"""No step of a request calls up the layers at run time (issue 44): scripts/request_walk.py's walk of a
live `serve --parallel 2` with two clients at once finds no call from a lower wing into a higher one
(core into serve, as the lane's K policy once was), and its report finds such a call where one is planted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import request_walk  # noqa: E402 - the script, from scripts/


@pytest.mark.live
def test_two_clients_at_once_call_nothing_up_the_layers():
    edges = request_walk.measure(argparse.Namespace(parallel=2, clients=2, tokens=12, json=None))
    found = request_walk.report(edges)
    assert found["up"] == []
    assert "core/lane_policy.py" in found["files"]  # the lanes' policy ran, in core
    assert len(found["files"]) <= 35  # fewer files than before issue 44 (36; docs/modules.md)
    # An editor's completion goes first between the steps of the server's own loop, not from inside a step.
    callers = {request_walk.relative(key.split("\t")[0]) for key in edges if key.endswith(":Lanes.between_steps")}
    assert callers == {"serve/generator.py"}


def test_the_report_finds_a_call_up_the_layers():
    """A planted callback: the engine calling the server's lanes from inside a step."""
    root = "/checkout/specgguf/"
    edges = {
        f"{root}core/engine.py:speculate\t{root}serve/parallel/lanes.py:Lanes.between_steps": 3,
        f"{root}serve/generator.py:Worker._run\t{root}core/engine.py:speculate": 1,
    }
    found = request_walk.report(edges)
    assert found["up"] == [("core/engine.py", "serve/parallel/lanes.py", 3)]
    assert found["by_wing"] == {"core": 1, "serve": 1}
