"""One thread decodes for the whole server (llama/runtime.py's `decode_on_one_thread`): llama.cpp's
OpenMP teams are per calling thread, and a second team made every decode ~1.5x slower on 2 cores."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from specgguf.llama.model import LlamaModel
from specgguf.llama.runtime import decode_on_one_thread, on_decode_thread


def test_calls_from_every_thread_run_on_the_one_decode_thread():
    decode_on_one_thread()
    decode_on_one_thread()  # once: a second call changes nothing
    names: list[str] = []

    def ask() -> None:
        names.append(on_decode_thread(lambda: threading.current_thread().name))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ask()
    assert names == ["specgguf-decode"] * 4
    assert on_decode_thread(lambda: on_decode_thread(lambda: 7)) == 7  # from the decode thread itself: at once


def test_an_error_reaches_the_caller():
    decode_on_one_thread()

    def fail() -> None:
        raise ValueError("llama.cpp said no")

    with pytest.raises(ValueError, match="said no"):
        on_decode_thread(fail)


def test_ctrl_c_during_a_decode_is_raised_once_the_decode_has_run():
    decode_on_one_thread()
    finished = threading.Event()

    def slow() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # while the caller waits: Python's handler runs on the main thread
        time.sleep(0.3)
        finished.set()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (whatever an earlier test left)
    try:
        with pytest.raises(KeyboardInterrupt):
            on_decode_thread(slow)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert finished.is_set()  # the decode was not cut off halfway: the cache and its list agree


def test_a_model_answers_the_same_from_several_threads(tiny_verifier):
    decode_on_one_thread()
    model = LlamaModel(tiny_verifier, n_ctx=128, n_threads=1)
    tokens = model.tokenize("the cat sat on the mat")
    here = model.eval(tokens, n_logits=1)
    model.clear()
    there: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: there.append(model.eval(tokens, n_logits=1)))
    thread.start()
    thread.join()
    np.testing.assert_array_equal(here, there[0])
    model.close()
