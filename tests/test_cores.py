"""The default thread count follows the machine's load (cores.py), read from /proc/stat minus our own CPU time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from specgguf.llama import threads as cores


@pytest.mark.parametrize(
    "busy, usable, expected",
    [
        (0.0, 2, 2),
        (0.3, 2, 2),
        (0.6, 2, 1),
        (1.0, 2, 1),
        (2.0, 2, 1),
        (0.0, 8, 8),
        (1.0, 8, 7),
        (2.6, 8, 5),
        (9.0, 8, 1),
    ],
)
def test_each_core_another_program_keeps_busy_takes_one_thread(busy, usable, expected):
    assert cores.threads_for(busy, usable) == expected


class Clock:
    """A scripted machine: wall time, the machine's busy CPU seconds and ours."""

    def __init__(self, monkeypatch):
        self.wall = self.machine = self.own = 0.0
        monkeypatch.setattr(cores.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(cores.time, "process_time", lambda: self.own)
        monkeypatch.setattr(cores, "_machine_busy_seconds", lambda: self.machine)

    def run(self, seconds: float, *, ours: float, others: float) -> None:
        """`seconds` pass with our process using `ours` cores and other programs `others`."""
        self.wall += seconds
        self.own += ours * seconds
        self.machine += (ours + others) * seconds


def test_the_governor_gives_up_a_thread_under_load_and_takes_it_back_when_idle(monkeypatch):
    clock = Clock(monkeypatch)
    governor = cores.ThreadGovernor(usable=2, threads=2)
    assert governor.check() is None  # the first look only starts the clock
    clock.run(0.6, ours=2.0, others=0.0)
    assert governor.check() is None and governor.threads == 2  # idle: all cores
    clock.run(0.1, ours=2.0, others=1.0)
    assert governor.check() is None  # looks at most every half second
    clock.run(0.5, ours=1.4, others=0.6)  # a busy process gets its share from our spinning threads
    assert governor.check() == 1 and governor.threads == 1
    clock.run(0.6, ours=1.0, others=0.4)  # still some load: no flapping back
    assert governor.check() is None and governor.threads == 1
    clock.run(0.6, ours=1.0, others=0.05)  # the other program stopped
    assert governor.check() == 2 and governor.threads == 2


def test_a_pause_between_decodes_starts_a_new_window_and_keeps_the_threads(monkeypatch):
    # An idle server's next request: what ran during the pause (an agent's tool, the client's start)
    # says nothing about now; the next half second does.
    clock = Clock(monkeypatch)
    governor = cores.ThreadGovernor(usable=2, threads=2)
    governor.check()
    clock.run(5.0, ours=0.0, others=1.0)  # busy while we waited for a request
    assert governor.check() is None and governor.threads == 2
    clock.run(0.6, ours=2.0, others=0.0)
    assert governor.check() is None and governor.threads == 2
    clock.run(0.6, ours=1.4, others=0.6)  # a busy process now: given up at the next look
    assert governor.check() == 1
    clock.run(5.0, ours=0.0, others=0.0)  # idle during a pause: kept until a look in a fresh window
    assert governor.check() is None and governor.threads == 1
    clock.run(0.6, ours=1.0, others=0.05)
    assert governor.check() == 2


def test_others_busy_cores_sees_a_real_busy_process():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert cores.others_busy_cores(interval=0.5) > 0.5
    finally:
        busy.kill()
        busy.wait()
