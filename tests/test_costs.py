"""Measuring costs (costs.py) on a fake model with scripted timings, and keeping them in tuning.json."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fakes import FakeModel, one_hot_logits
from specgguf import tuning
from specgguf.core import costs
from specgguf.tuning import BenchResult, load_tuning, store_measurement, store_seconds, stored_seconds

pytestmark = pytest.mark.usefixtures("config_home")

CLOCK = SimpleNamespace(now=0.0)  # a scripted clock: no timing window for a busy machine to miss


@pytest.fixture(autouse=True)
def scripted_clock(monkeypatch):
    monkeypatch.setattr(costs, "time", SimpleNamespace(perf_counter=lambda: CLOCK.now))


class TimedModel(FakeModel):
    """Evaluating a batch of n tokens takes seconds[n] on the scripted clock (others take nothing)."""

    def __init__(self, seconds: dict[int, float]):
        super().__init__(one_hot_logits(lambda context: 0, 8), n_vocab=8, n_ctx=64)
        self.seconds = seconds

    def eval(self, tokens, *, n_logits):
        CLOCK.now += self.seconds.get(len(tokens), 0.0)
        return super().eval(tokens, n_logits=n_logits)


def test_measure_times_each_batch_size_after_the_context_and_leaves_the_cache_empty():
    # Irregular on purpose: a batch of 3 is cheaper than one of 1, as kernel choices can make it.
    seconds = {1: 0.004, 2: 0.008, 3: 0.002, 4: 0.012}
    model = TimedModel(seconds)
    measured = costs.measure(model, max_batch=4, repeats=3, context=10)
    assert measured == pytest.approx([seconds[n] for n in (1, 2, 3, 4)])
    assert model.cached == []
    # One context, one warm-up batch, then 3 rounds of every size, each after the same 10 tokens.
    sizes = [len(call) for call in model.eval_calls]
    assert sizes == [10, 4] + [1, 2, 3, 4] * 3
    assert costs.describe([0.0041, 0.0608]) == "verify ms by batch size: 1: 4 · 2: 61"


def test_measure_read_times_one_long_batch_a_token_and_leaves_the_cache_empty():
    model = TimedModel({24: 0.048})  # half of n_ctx read at once, after as much context as is left
    model.n_ctx = 48
    assert costs.measure_read(model, n=128, repeats=2) == pytest.approx(0.002)
    assert [len(call) for call in model.eval_calls] == [24, 24, 24] and model.cached == []


def test_stored_tables_are_kept_per_key_beside_other_measurements(tmp_path):
    store_measurement(tmp_path / "big.gguf", tmp_path / "small.gguf", 0.0, BenchResult(4, 1.3))
    store_seconds("verify_costs|big.gguf|1|threads=2|gpu_layers=0", [0.03, 0.05, 0.06])
    assert stored_seconds("verify_costs|big.gguf|1|threads=2|gpu_layers=0") == [0.03, 0.05, 0.06]
    assert stored_seconds("verify_costs|big.gguf|1|threads=4|gpu_layers=0") is None
    (per_machine,) = load_tuning().values()
    assert len(per_machine) == 2  # the pair's best K is still there
    # A hand-edited table that makes no sense is ignored, not used.
    store_seconds("bad", [0.03, -1.0])
    assert stored_seconds("bad") is None


class FileModel(TimedModel):
    """A timed fake that looks like a loaded file, as tuning.key_for reads it."""

    def __init__(self, path, seconds):
        super().__init__(seconds)
        self.path, self.n_threads, self.n_gpu_layers = path, 2, 0


def test_probe_measures_once_per_machine_and_file_then_reads_the_store(tmp_path):
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    (tmp_path / "d.gguf").write_bytes(b"d" * 5)
    verifier = FileModel(tmp_path / "v.gguf", {n: 0.002 + 0.002 * n for n in range(1, 9)})
    draft = FileModel(tmp_path / "d.gguf", {1: 0.002, 32: 0.016})  # (n_ctx 64: it reads 32 at once)
    announced = []
    first = tuning.probe(verifier, draft, on_measure=lambda: announced.append(True))
    assert announced == [True] and len(first.verify) == costs.PROBE_BATCH
    assert first.verify[:2] == (0.004, 0.006) and first.draft == 0.002 and first.draft_read == 0.0005
    calls = len(verifier.eval_calls) + len(draft.eval_calls)
    again = tuning.probe(verifier, draft, on_measure=lambda: announced.append(True))
    assert again == first and announced == [True]  # from tuning.json, nothing measured
    assert len(verifier.eval_calls) + len(draft.eval_calls) == calls
    # Another thread count is another measurement; plain decoding needs no draft cost.
    verifier.n_threads = 1
    assert tuning.probe(verifier, on_measure=lambda: announced.append(True)).draft == 0.0
    assert announced == [True, True]


def test_probe_in_a_config_folder_that_cannot_be_written_warns_and_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "v.gguf").write_bytes(b"v")
    measured = tuning.probe(FileModel(tmp_path / "v.gguf", {n: 0.01 * n for n in range(1, 9)}))
    assert len(measured.verify) == costs.PROBE_BATCH
    assert "not keeping the measured costs" in capsys.readouterr().err
