"""Ctrl-C during a chat answer: the first stops the answer after its current step, a second leaves.

Signals that arrive while llama.cpp computes a step are handled by Python once the step returns,
and two of them then reach the handler as one call; so every SIGINT is also counted through
`signal.set_wakeup_fd` (one byte per signal, written by Python's C-level handler). The handler only
sets flags: nothing is raised inside a model call or a callback from llama.cpp.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from ..errors import SpecggufError


class LeftWithCtrlC(SpecggufError):
    """A second Ctrl-C during an answer: the chat ends, exit 130 (the models are freed with Ctrl-C ignored)."""

    exit_code = 130


@contextlib.contextmanager
def ctrl_c_sets(stop: threading.Event, leave: threading.Event):
    """During the block the first Ctrl-C sets `stop`, a second one `leave` too; afterwards Ctrl-C is
    what it was, or ignored once `leave` is set (the chat is ending: let the models be freed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    count = 0

    def on_interrupt(signum, frame):
        nonlocal count
        with contextlib.suppress(BlockingIOError):
            count += os.read(read_end, 64).count(signal.SIGINT.to_bytes(1, "little"))
        count = max(count, 1 if not stop.is_set() else 2)  # at least this call's own signal
        stop.set()
        if count >= 2:
            leave.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN if leave.is_set() else previous)
        os.close(read_end)
        os.close(write_end)
