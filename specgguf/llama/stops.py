"""A request stopped during its model calls: `serve` runs each request's generation inside
`stops_when(its Stop)`, and a call that evaluates tokens in chunks (a prompt's pass, a draft model
catching up: `LlamaModel.eval`, `SequenceView.eval`) asks `check_stop()` before each chunk. A chunk
of many rows that is one request's alone is also given to llama.cpp as abortable: llama.cpp asks
the stop's flag between the nodes of its graph and, once it is set, abandons the pass and removes
its cells. A client that hangs up during a 3,000-token prompt then frees its lane, and the one
thread that decodes, within milliseconds, not at the end of the whole pass.

The stop is per thread (a generator thread runs one request at a time), so the engine's loop and
its `Model` protocol stay as they are; it raises `Cancelled`, and every cache keeps the chunks
evaluated before it, whole: the next request that shares the prompt reuses them.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

from ..errors import Cancelled

ABORTABLE_ROWS = 32  # a chunk of at least this many rows (a prompt's) is abortable inside its pass


class Stop:
    """A request's stop: set from any thread (its client hung up, the server is stopping); read by
    Python (`is_set`) and, during a pass, by llama.cpp without the GIL (`flag`: a C string that is
    empty until the stop is set)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.flag = ctypes.create_string_buffer(2)  # b"\0\0"; b"\1\0" once set

    def set(self) -> None:
        self.flag[0] = b"\x01"
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


_thread = threading.local()


@contextlib.contextmanager
def stops_when(stop: Stop) -> Iterator[None]:
    """Within the block, on this thread: a model call raises `Cancelled` before its next chunk, or
    inside an abortable one, once `stop` is set."""
    previous = getattr(_thread, "stop", None)
    _thread.stop = stop
    try:
        yield
    finally:
        _thread.stop = previous


def current() -> Stop | None:
    """This thread's stop, inside `stops_when`."""
    return getattr(_thread, "stop", None)


def check_stop() -> None:
    """(Before a chunk.) `Cancelled` if this thread's request has been stopped."""
    stop = current()
    if stop is not None and stop.is_set():
        raise Cancelled("the request was cancelled")
