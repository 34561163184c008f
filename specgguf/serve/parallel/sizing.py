"""How many live sequences `serve` keeps without --parallel: as many as the memory free after loading
holds (a share of it), within bounds."""

from __future__ import annotations

MIN_PARALLEL, MAX_AUTO_PARALLEL = 2, 4  # --parallel's default: at least 2, at most 4, as memory allows
MEMORY_SHARE = 0.5  # of the memory free after loading, what the default lets the sequences take


def memory_available() -> int | None:
    """Bytes of memory available now (/proc/meminfo's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_parallel(bytes_per_sequence: int, available: int | None) -> int:
    """How many sequences `serve` keeps live without --parallel: as many as half the free memory holds,
    at least MIN_PARALLEL, at most MAX_AUTO_PARALLEL."""
    if available is None or bytes_per_sequence <= 0:
        return MIN_PARALLEL
    fits = int(available * MEMORY_SHARE) // bytes_per_sequence
    return max(MIN_PARALLEL, min(MAX_AUTO_PARALLEL, fits))
