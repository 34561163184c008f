"""Measuring verify cost by batch size (verify_costs.py) on a fake model with scripted timings."""

from __future__ import annotations

import time

import pytest

from fakes import FakeModel, one_hot_logits
from specgguf import verify_costs
from specgguf.tuning import load_tuning, store_measurement, store_verify_costs, stored_verify_costs


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))


class TimedModel(FakeModel):
    """Evaluating a batch of n tokens takes seconds[n] (the context's ingestion takes nothing)."""

    def __init__(self, seconds: dict[int, float]):
        super().__init__(one_hot_logits(lambda context: 0, 8), n_vocab=8, n_ctx=64)
        self.seconds = seconds

    def eval(self, tokens, *, n_logits):
        if len(tokens) in self.seconds:
            time.sleep(self.seconds[len(tokens)])
        return super().eval(tokens, n_logits=n_logits)


def test_measure_times_each_batch_size_after_the_context_and_leaves_the_cache_empty():
    # Irregular on purpose: a batch of 3 is cheaper than one of 1, as kernel choices can make it.
    seconds = {1: 0.004, 2: 0.008, 3: 0.002, 4: 0.012}
    model = TimedModel(seconds)
    measured = verify_costs.measure(model, max_batch=4, repeats=3, context=10)
    assert measured[2] < measured[0] < measured[1] < measured[3]
    for n, cost in enumerate(measured, 1):
        assert seconds[n] <= cost < seconds[n] + 0.003  # sleep overshoots a little, never undershoots
    assert model.cached == []
    # One context, one warm-up batch, then 3 rounds of every size, each after the same 10 tokens.
    sizes = [len(call) for call in model.eval_calls]
    assert sizes == [10, 4] + [1, 2, 3, 4] * 3
    assert verify_costs.describe([0.0041, 0.0608]) == "verify ms by batch size: 1: 4 · 2: 61"


def test_stored_tables_are_kept_per_key_beside_other_measurements(tmp_path):
    store_measurement(tmp_path / "big.gguf", tmp_path / "small.gguf", 0.0, {"k": 4, "speedup": 1.3})
    store_verify_costs("verify_costs|big.gguf|1|threads=2|gpu_layers=0", [0.03, 0.05, 0.06])
    assert stored_verify_costs("verify_costs|big.gguf|1|threads=2|gpu_layers=0") == [0.03, 0.05, 0.06]
    assert stored_verify_costs("verify_costs|big.gguf|1|threads=4|gpu_layers=0") is None
    (per_machine,) = load_tuning().values()
    assert len(per_machine) == 2  # the pair's best K is still there
    # A hand-edited table that makes no sense is ignored, not used.
    store_verify_costs("bad", [0.03, -1.0])
    assert stored_verify_costs("bad") is None
