"""How many threads llama.cpp should use: the cores this process may use, less those other programs keep busy.

llama.cpp's threads wait for each other by spinning. On a machine where another program
keeps a core busy, one of our threads is descheduled for a whole time slice at every
barrier and the others spin until it returns: with 2 threads on 2 cores and one busy
process, decoding gets ~15x slower, while 1 thread loses only what the busy core costs.
So by default the thread count follows the load: `ThreadGovernor` reads the machine's CPU
time (/proc/stat) minus our own every half second while it decodes, and gives up a thread for
each core another program keeps busy (taken back when it goes idle). An explicit `-t` is kept as given.
Elsewhere than Linux (no /proc/stat) it is all usable cores, as llama.cpp does.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

_CHECK_EVERY = 0.5  # seconds between looks at the load
_BUSY = 0.5  # another program using this much of a core takes that core
_IDLE = 0.25  # ... and gives it back below this (hysteresis: no flapping at the edge)
# A look longer than this after the last (a server idle between requests) starts a new window and keeps
# the thread count: the load averaged over a pause is what ran while we did not decode (an agent's
# tool, a client starting up), not what runs now, and it once cost a 629-token prompt half its speed.
_STALE = 2.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _machine_busy_seconds() -> float | None:
    """CPU seconds spent busy on all cores since boot (/proc/stat), or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    ticks = [int(value) for value in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def others_busy_cores(interval: float = 0.1) -> float:
    """How many cores other programs keep busy, sampled over `interval` seconds (0 if unknown)."""
    before, own_before, start = _machine_busy_seconds(), time.process_time(), time.monotonic()
    if before is None:
        return 0.0
    time.sleep(interval)
    after = _machine_busy_seconds()
    elapsed = time.monotonic() - start
    own = time.process_time() - own_before
    return max(0.0, ((after or before) - before - own) / elapsed)


def threads_for(busy: float, usable: int) -> int:
    """Threads to run when other programs keep `busy` cores busy."""
    taken = math.floor(busy + (1 - _BUSY)) if busy >= _BUSY else 0
    return max(1, usable - taken)


@dataclass
class ThreadGovernor:
    """Follows the machine's load: `check()` returns a new thread count when it should change, else None."""

    usable: int = field(default_factory=usable_cores)
    threads: int = 0
    _last: tuple[float, float, float] | None = None  # (wall, machine busy, own CPU) at the last look

    def __post_init__(self) -> None:
        if self.threads <= 0:
            self.threads = threads_for(others_busy_cores(), self.usable)

    def check(self) -> int | None:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < _CHECK_EVERY:
            return None
        machine, own = _machine_busy_seconds(), time.process_time()
        if machine is None:
            return None
        last, self._last = self._last, (now, machine, own)
        if last is None or now - last[0] > _STALE:
            return None
        busy = max(0.0, (machine - last[1] - (own - last[2])) / (now - last[0]))
        wanted = threads_for(busy, self.usable)
        if wanted < self.threads or (wanted > self.threads and busy < _IDLE * (self.usable - wanted + 1)):
            self.threads = wanted
            return wanted
        return None
