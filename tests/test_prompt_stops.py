"""A request stopped during its prompt's pass (issue 43): the server runs each generation inside
`llama.stops.stops_when(its client has gone)`, and every model call that evaluates in chunks checks
it before each chunk. A client that hangs up during a long prompt frees the server within one
chunk, not at the end of the pass; the chunks evaluated stay cached, whole, for the next request."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from live_server import live_server
from specgguf.errors import Cancelled
from specgguf.llama.batcher import Batcher, Rows
from specgguf.llama.model import LlamaModel
from specgguf.llama.stops import Stop, check_stop, stops_when


class _CountingDecoder:
    """Decodes nothing (zero logits) and counts its passes; the stop is asked for after `stop_after`."""

    n_batch = 16

    def __init__(self, stop: Stop, stop_after: int):
        self.stop, self.passes, self.stop_after = stop, 0, stop_after
        self.line: tuple[float, float] | None = None  # no pass line learned

    def decode(self, work: list[Rows]) -> list[np.ndarray]:
        self.passes += 1
        if self.passes == self.stop_after:
            self.stop.set()
        return [np.zeros((rows.n_logits, 8), dtype=np.float32) for rows in work]

    def remove(self, seq: int, start: int) -> None:
        pass

    def pass_line(self) -> tuple[float, float] | None:
        return self.line


def test_a_sequences_long_eval_stops_between_chunks_and_keeps_the_chunks_done():
    from specgguf.llama.batcher import SequenceView

    stop = Stop()
    decoder = _CountingDecoder(stop, stop_after=3)
    view = SequenceView(Batcher(decoder), 0, n_ctx=1000, n_vocab=8, is_eog=lambda token: False)
    with stops_when(stop), pytest.raises(Cancelled):
        view.eval(list(range(100)), n_logits=1)
    assert decoder.passes == 3 and view.cached == list(range(48))  # three whole chunks of 16, cached
    # Outside the block (another request on this thread) nothing stops it.
    view.eval(list(range(48, 100)), n_logits=1)
    assert view.cached == list(range(100))


def test_a_models_long_eval_stops_between_chunks_and_the_cache_stays_exact(tiny_verifier, monkeypatch):
    model = LlamaModel(tiny_verifier, n_ctx=256, n_threads=1, n_batch=32)
    tokens = (model.tokenize("the cat sat on the mat and looked at the dog. ") * 12)[:200]
    stop, decoded, decode = Stop(), [], model.decode_batch

    def decode_then_stop(batch, stop_flag=None):
        decode(batch, stop_flag)
        decoded.append(batch.n_tokens)
        if len(decoded) == 2:
            stop.set()  # the client hangs up during the second chunk

    monkeypatch.setattr(model, "decode_batch", decode_then_stop)
    with stops_when(stop), pytest.raises(Cancelled):
        model.eval(tokens, n_logits=0)
    assert decoded == [32, 32] and model.cached == tokens[:64]
    # The rest, evaluated after the stop, scores as one pass over the whole prompt would.
    resumed = model.eval(tokens[64:], n_logits=1)
    model.rewind(0)
    whole = model.eval(tokens, n_logits=1)
    np.testing.assert_allclose(resumed, whole, atol=1e-3)
    model.close()


@pytest.mark.parametrize("sequences", [False, True])
def test_a_long_pass_is_abandoned_inside_once_its_request_stops_and_leaves_no_cells(smollm2, sequences):
    """One chunk of 500 rows (a prompt's pass), its stop set 50 ms in: llama.cpp abandons the pass
    (abort callback) and removes its cells; the same tokens then score as on a model never stopped."""
    model = LlamaModel(smollm2, n_ctx=1024, n_threads=1, n_batch=512)
    tokens = model.tokenize(" ".join(f"item {i} is {i * 7 % 13}." for i in range(80)))[:500]
    views = model.sequences(2) if sequences else [model]
    view = views[-1]
    started = time.perf_counter()
    view.eval(tokens, n_logits=1)
    whole_pass = time.perf_counter() - started
    expected = view.eval([tokens[0]], n_logits=1)
    view.rewind(0)
    stop = Stop()
    timer = threading.Timer(0.05, stop.set)
    timer.start()
    started = time.perf_counter()
    with stops_when(stop), pytest.raises(Cancelled):
        view.eval(tokens, n_logits=1)
    stopped_after = time.perf_counter() - started
    timer.join()
    assert view.n_past == 0
    assert stopped_after < 0.5 * whole_pass, (stopped_after, whole_pass)  # inside the pass, not after it
    view.eval(tokens, n_logits=1)  # no cell of the abandoned pass is left in the way
    np.testing.assert_allclose(view.eval([tokens[0]], n_logits=1), expected, atol=1e-3)
    model.close()


def test_the_stop_is_per_thread_and_nests():
    seen = []
    stopped, going = Stop(), Stop()
    stopped.set()
    with stops_when(stopped):
        thread = threading.Thread(target=lambda: seen.append(_raises()))
        thread.start()
        thread.join()
        with stops_when(going):
            check_stop()  # the inner block's stop
        with pytest.raises(Cancelled):
            check_stop()  # the outer one again
    check_stop()
    assert seen == [False]  # another thread is not stopped by this one's request


def _raises() -> bool:
    try:
        check_stop()
    except Cancelled:
        return True
    return False


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _send_and_hang_up(port: int, prompt: str, after: float) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(head + body)
        time.sleep(after)  # the prompt's pass is under way


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the server's CPU time from /proc")
@pytest.mark.parametrize("parallel", [1, 4])
def test_a_client_that_hangs_up_during_a_long_prompt_frees_the_server_within_a_chunk(smollm2, parallel):
    """A prompt of ~3,700 tokens (about ten seconds of prompt on one thread here), its client gone a
    second in: the server goes quiet within a chunk (before: it read the whole prompt), and a tiny
    request is answered within seconds."""
    prompt = " ".join(f"item {i} is {i * 7 % 13}." for i in range(400))
    reader = LlamaModel(smollm2, n_ctx=64, n_threads=1)
    assert 3000 < len(reader.tokenize(prompt)) < 4000
    reader.close()
    args = ["-m", smollm2, "--drafter", "ngram", "-c", "4096", "-t", "1", "-np", parallel]
    with live_server(*args) as server:
        _send_and_hang_up(server.port, prompt, after=1.0)
        started = time.monotonic()
        with server.http() as http:
            tiny = http.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 2}, timeout=60)
        assert tiny.status_code == 200 and tiny.json()["choices"][0]["text"]
        waited = time.monotonic() - started
        time.sleep(1.0)
        before = _cpu_seconds(server.process.pid)
        time.sleep(2.0)
        busy = _cpu_seconds(server.process.pid) - before
        assert busy < 0.5, f"the server was busy for {busy:.1f} s of 2 s after the client left"
        assert waited < 4.0, f"a two-token completion waited {waited:.1f} s behind a client that had left"


class _LinedDecoder:
    """Decodes nothing; records each pass's rows per sequence; its pass line is (10 ms, 10 ms a row)."""

    n_batch = 512

    def __init__(self) -> None:
        self.passes: list[dict[int, int]] = []
        self.line: tuple[float, float] | None = (0.01, 0.01)

    def decode(self, work: list[Rows]) -> list[np.ndarray]:
        self.passes.append({rows.seq: len(rows.tokens) for rows in work})
        time.sleep(0.001 * sum(len(rows.tokens) for rows in work))
        return [np.zeros((rows.n_logits, 8), dtype=np.float32) for rows in work]

    def remove(self, seq: int, start: int) -> None:
        pass

    def pass_line(self) -> tuple[float, float] | None:
        return self.line


def test_a_prompt_among_live_requests_goes_in_short_chunks_that_their_steps_ride_along():
    """Alone, a prompt of 300 tokens is one pass; with another request live, chunks of about
    SHARED_CHUNK_SECONDS by the pass line (49 rows here), and the other's steps share their passes
    instead of waiting out one of 300 rows."""
    from specgguf.llama.batcher import SHARED_CHUNK_SECONDS, SequenceView

    decoder = _LinedDecoder()
    batcher = Batcher(decoder, wait_seconds=0.5)
    prompt, chat = (SequenceView(batcher, seq, n_ctx=4096, n_vocab=8, is_eog=lambda t: False) for seq in (0, 1))
    with batcher.participant():
        prompt.eval(list(range(300)), n_logits=1)
    assert decoder.passes == [{0: 300}]
    decoder.passes.clear()
    chunk = int((SHARED_CHUNK_SECONDS - 0.01) / 0.01)
    steps_done = threading.Event()

    def chat_steps() -> None:
        with batcher.participant():
            for _ in range(4):
                chat.eval([1], n_logits=1)
        steps_done.set()

    with batcher.participant():
        thread = threading.Thread(target=chat_steps)
        thread.start()
        time.sleep(0.05)  # the chat is live
        prompt.eval(list(range(300, 600)), n_logits=1)
        thread.join()
    prompt_chunks = [rows[0] for rows in decoder.passes if 0 in rows]
    # Short chunks while the chat is live; once it has ended, the rest in one pass.
    assert prompt_chunks[:4] == [chunk] * 4 and prompt_chunks[4:] == [300 - 4 * chunk]
    assert sum(1 in rows for rows in decoder.passes) == 4
    assert sum(0 in rows and 1 in rows for rows in decoder.passes) >= 3  # the chat's steps rode along


def test_a_request_reading_a_prompt_on_one_model_does_not_hold_the_other_models_batches():
    """Two lanes, each a participant of both models' batchers. While lane 0 reads a long prompt on
    the verifier, lane 1's draft calls decode at once: the draft's batcher does not wait its
    `wait_seconds` for lane 0, which brings it no rows (serve/parallel/lanes.py pairs the views as partners)."""
    from specgguf.llama.batcher import SequenceView

    verifier_batcher = Batcher(_LinedDecoder(), wait_seconds=2.0)
    draft_batcher = Batcher(_LinedDecoder(), wait_seconds=2.0)

    def views(seq: int) -> tuple[SequenceView, SequenceView]:
        verifier, draft = (
            SequenceView(batcher, seq, n_ctx=4096, n_vocab=8, is_eog=lambda t: False)
            for batcher in (verifier_batcher, draft_batcher)
        )
        verifier.partners, draft.partners = [draft], [verifier]
        return verifier, draft

    (reader, _), (_, drafting) = views(0), views(1)
    live = threading.Barrier(2)
    seconds: list[float] = []

    def read_prompt() -> None:
        with verifier_batcher.participant(), draft_batcher.participant():
            live.wait()
            reader.eval(list(range(400)), n_logits=1)  # 0.4 s a pass alone; 0.5 s chunks with others live

    def draft_steps() -> None:
        with verifier_batcher.participant(), draft_batcher.participant():
            live.wait()
            time.sleep(0.1)  # the prompt's pass is under way
            for _ in range(3):
                started = time.perf_counter()
                drafting.eval([1], n_logits=1)
                seconds.append(time.perf_counter() - started)

    threads = [threading.Thread(target=read_prompt), threading.Thread(target=draft_steps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(seconds) < 0.5, seconds  # not the 2 s the batcher waits for a participant
