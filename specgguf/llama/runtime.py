"""llama.cpp's process-wide state, set up once on import: its log (kept in a ring buffer, shown
on failure or with SPECGGUF_DEBUG=1), Ctrl-C while it loads, one line for a model file cut short
under a running process (SIGBUS), the thread governor, and the one thread that decodes where
several threads ask (`decode_on_one_thread`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp

from ..errors import ModelLoadError, debug_enabled
from .stops import Stop
from .threads import ThreadGovernor

# --- logging: llama.cpp's messages go to a ring buffer, shown on failure or on request ---
_LOG_ERROR = 3
recent_log: deque[str] = deque(maxlen=40)
_ECHO = debug_enabled()  # read once: the callback runs for each of llama.cpp's lines, from its threads


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if level == _LOG_ERROR:
        recent_log.append(message.strip())
    if _ECHO:
        os.write(2, text)


# --- Ctrl-C while llama.cpp loads: Python drops a KeyboardInterrupt raised inside a C callback
# ("Exception ignored ..."), so while loading, Ctrl-C only sets a flag, the progress callback
# asks llama.cpp to stop, and the interrupt is raised once llama.cpp has returned.
_interrupted = threading.Event()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C during the block stops it and raises KeyboardInterrupt afterwards, never lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _interrupted.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _interrupted.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def ends_at_ctrl_c(partial: Path) -> Iterator[None]:
    """For a llama.cpp call that cannot be asked to stop (the quantizer): Ctrl-C ends the process at
    once, exit 130 with one line, the partial file it was writing removed. Its handler runs at
    llama.cpp's next log line (where a KeyboardInterrupt would be dropped: "Exception ignored") or
    when the call returns, so a minute's quantization is not waited out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_signum: int, _frame: object) -> None:
        partial.unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.write(2, b"specgguf: error: interrupted\n")
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def load_model(
    path: Path, params: llama_cpp.llama_model_params, *, on_progress: Callable[[], None] | None = None
) -> ctypes.c_void_p | None:
    """llama.cpp's load, abandoned at once on Ctrl-C; `on_progress` is called as it goes."""

    def progress(_progress: float, _user_data: ctypes.c_void_p) -> bool:
        if on_progress is not None:
            on_progress()
        return not _interrupted.is_set()  # False: llama.cpp abandons the load

    callback = llama_cpp.llama_progress_callback(progress)  # referenced until the load returns
    params.progress_callback = callback
    with interruptible():
        return llama_cpp.llama_model_load_from_file(str(path).encode(), params)


# --- a model file cut short or rewritten under us: llama.cpp reads weights through a memory map, and
# a page whose bytes are gone is a SIGBUS, which kills the process without a word. A Python handler
# cannot help (it would run after the faulting instruction, which the kernel retries forever), so the
# handler is C-level, through libc's signal(): one line, then the process ends.
_BUS_ERROR_LINE = (
    b"specgguf: error: a model file changed while this process was reading it (cut short or rewritten"
    b" in place: SIGBUS); stopped\n"
)


@ctypes.CFUNCTYPE(None, ctypes.c_int)
def _on_bus_error(_signum: int) -> None:  # pragma: no cover - runs in a dying process
    os.write(2, _BUS_ERROR_LINE)
    os._exit(1)


def _catch_bus_errors() -> None:
    """Our SIGBUS handler, unless Python's faulthandler is on (its thread dump is what a debugger wants)."""
    import faulthandler

    if not hasattr(signal, "SIGBUS") or faulthandler.is_enabled():
        return
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGBUS, ctypes.cast(_on_bus_error, ctypes.c_void_p))


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
_catch_bus_errors()


_governor: ThreadGovernor | None = None


def shared_governor() -> ThreadGovernor:
    """One for the process: both models follow the same reading of the load."""
    global _governor
    if _governor is None:
        _governor = ThreadGovernor()
    return _governor


def reason(default: str) -> str:
    """The last error llama.cpp logged, for a one-line message."""
    errors = [line for line in recent_log if line]
    return errors[-1] if errors else default


def check_gguf_file(path: Path) -> None:
    """Fail with a clear message before llama.cpp sees a file that cannot be a GGUF."""
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: not a file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")


# --- one thread decodes. llama.cpp's CPU backend runs each decode as an OpenMP parallel region, and
# each thread that calls it gets a team of worker threads of its own. Once libgomp manages more
# threads than there are cores, it stops spinning at its barriers (a decode has hundreds) and its
# threads sleep and wake instead: a step of the 1.5B Q4 verifier took 56 ms, not 36, once a second
# thread had decoded (2 cores). The server decodes from several threads (the start-up measurements
# on the main one, then a generator thread per request), so it calls `decode_on_one_thread()`:
# from then on every decode of the process runs on one thread of ours, as llama-server's do.
T = TypeVar("T")
_DecodeCall = tuple[Callable[[], Any], list[tuple[bool, Any]], threading.Event]  # the call, its outcome, done
_decode_calls: queue.SimpleQueue[_DecodeCall] | None = None
_decode_thread: threading.Thread | None = None
_decode_start = threading.Lock()


def decode_on_one_thread() -> None:
    """From now on, `on_decode_thread` runs its calls on one thread (started here, once)."""
    global _decode_calls, _decode_thread
    with _decode_start:
        if _decode_thread is None:
            calls: queue.SimpleQueue[_DecodeCall] = queue.SimpleQueue()
            _decode_thread = threading.Thread(target=_decode_loop, args=(calls,), name="specgguf-decode", daemon=True)
            _decode_thread.start()
            _decode_calls = calls


def _decode_loop(calls: queue.SimpleQueue[_DecodeCall]) -> None:
    while True:
        call, outcome, done = calls.get()
        try:
            outcome.append((True, call()))
        except BaseException as error:  # noqa: BLE001 - the caller raises it
            outcome.append((False, error))
        finally:
            done.set()


def on_decode_thread(call: Callable[[], T]) -> T:
    """`call()` (a llama.cpp decode), on the decode thread once `decode_on_one_thread` started it,
    else here. A Ctrl-C meanwhile is raised after the call returns, as it would be here (a decode
    that ran is never half recorded)."""
    if _decode_calls is None or threading.current_thread() is _decode_thread:
        return call()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    _decode_calls.put((call, outcome, done))
    interrupted = False
    while not done.is_set():
        try:
            done.wait()
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


# --- a pass llama.cpp abandons once a request's stop is set (stops.py). llama.cpp calls its abort
# callback on the thread computing the graph, between nodes, hundreds of times a pass: a Python
# callback would take the GIL each time (and wait for it while another request's thread samples),
# so the callback is libc's strlen over the stop's flag, a C string that is empty until the stop is
# set (strlen 0: go on; 1: abort). No Python runs inside the pass. llama.cpp then returns 2 and
# removes the cells of the pass it abandoned: the cache is as it was before it.
ABORTED = 2


def _flag_reader() -> Any:
    try:
        address = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):  # no C library to reach this way: passes are not abortable
        return None
    return None if address is None else llama_cpp.ggml_abort_callback(address)


_READ_FLAG = _flag_reader()
_NO_CALLBACK = llama_cpp.ggml_abort_callback()  # a null function pointer


def decode(context: Any, batch: Any, stop: Stop | None = None) -> int:
    """llama_decode of `batch` on the decode thread; with `stop`, abandoned (ABORTED) once it is set."""
    if stop is None or _READ_FLAG is None:
        return on_decode_thread(lambda: llama_cpp.llama_decode(context, batch))

    def abortable() -> int:
        llama_cpp.llama_set_abort_callback(context, _READ_FLAG, ctypes.cast(stop.flag, ctypes.c_void_p))
        try:
            return llama_cpp.llama_decode(context, batch)
        finally:
            llama_cpp.llama_set_abort_callback(context, _NO_CALLBACK, None)

    return on_decode_thread(abortable)
