"""scripts/policy_replay.py's clock: with noise, the engine reads each pass off by a seeded draw (so the
policy learns noisy costs, as on a real machine), while the ratios are taken of the modelled time itself."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from policy_replay import Clock, curve, pass_seconds  # noqa: E402 - the script, from scripts/


def _reads(clock: Clock, seed: int) -> tuple[float, float]:
    clock.now = clock.seen = 0.0
    clock.reseed(seed)
    for seconds in (0.03, 0.05, 0.03, 0.1):
        clock.advance(seconds)
    return clock.now, clock()


def test_noise_moves_what_the_engine_reads_not_the_modelled_time():
    quiet, noisy = Clock(), Clock(0.1)
    assert _reads(quiet, 1) == pytest.approx((0.21, 0.21))
    now, seen = _reads(noisy, 1)
    assert now == pytest.approx(0.21) and seen != pytest.approx(0.21) and seen > 0
    assert _reads(noisy, 1) == (now, seen)  # a seed replays the same draws
    assert _reads(noisy, 2)[1] != seen


def test_a_curve_is_read_as_seconds_and_a_bad_one_is_an_argument_error():
    assert curve("27,54.5") == pytest.approx((0.027, 0.0545))
    for bad in ("27", "27,x", "27,-1", "27,,54", "27,inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="milliseconds for 1, 2"):
            curve(bad)


def test_a_pass_costs_the_curve_and_each_row_its_reading_of_the_context_past_the_curves():
    verify = [0.06, 0.09, 0.11]
    assert pass_seconds(verify, 2, 4000, 0.0) == pytest.approx(0.09)
    assert pass_seconds(verify, 6, 100, 5e-6) == pytest.approx(0.22)  # past the curve: its last size's per row
    assert pass_seconds(verify, 1, 200, 5e-6) == pytest.approx(0.06)  # before the curve's context: nothing more
    assert pass_seconds(verify, 3, 2256, 5e-6) == pytest.approx(0.11 + 3 * 5e-6 * 2000)
