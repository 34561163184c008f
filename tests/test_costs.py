"""Measuring costs (costs.py) on a fake model with scripted timings, and keeping them in tuning.json."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from fakes import FakeModel, one_hot_logits
from specgguf import tuning
from specgguf.core import costs
from specgguf.files.tuning_file import update_tuning
from specgguf.kchoice import KChoice
from specgguf.prepare import DraftOptions, Prepared
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
    # A hand-edited table that makes no sense is ignored, not used; nor is one ever stored.
    _hand_edit("bad", [0.03, -1.0])
    assert stored_seconds("bad") is None
    with pytest.raises(tuning.InvalidEntry):
        store_seconds("bad", [0.03, -1.0])


def _hand_edit(key: str, costs: list[float]) -> None:
    """An entry written into tuning.json as a hand (or an older version) may have left it."""
    update_tuning(lambda data: data.setdefault(tuning.machine_id(), {}).__setitem__(key, costs))


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


def test_a_table_costlier_than_its_single_passes_is_one_measured_on_a_busy_machine():
    # 1.84x one for 2 rows is this machine's Q4_K_M verifier with every row's logits: plausible.
    assert costs.disturbed([0.0249, 0.0458, 0.0616, 0.0760]) is None
    assert costs.disturbed([0.02, 0.0509]) is None  # within the slack of two passes and a millisecond
    assert costs.disturbed([0.02, 0.0511]) == 2
    # Probed beside a compiler on both cores: 2 rows 3.8x one, and no forced token was ever drafted.
    assert costs.disturbed([0.0679, 0.2589, 0.2458, 0.3550, 0.4160, 0.5177]) == 2
    # A tiny model's passes of 0.07 ms jitter by as much: a spike under a millisecond is no busy machine.
    assert costs.disturbed([0.000068, 0.000250, 0.000099]) is None


def test_bench_keeps_a_verify_table_only_with_a_plausible_shape(capsys):
    tuning.store_measured("verify_costs|busy.gguf|1|threads=2|gpu_layers=0", [0.0679, 0.2589, 0.2458])
    assert stored_seconds("verify_costs|busy.gguf|1|threads=2|gpu_layers=0") is None
    assert "not keeping the verify costs: a batch of 2 tokens at 3.8× one token's cost" in capsys.readouterr().err
    tuning.store_measured("verify_costs|quiet.gguf|1|threads=2|gpu_layers=0", [0.0249, 0.0458, 0.0616])
    assert stored_seconds("verify_costs|quiet.gguf|1|threads=2|gpu_layers=0") == [0.0249, 0.0458, 0.0616]


class BusyModel(FileModel):
    """A verifier whose batches of 2 take 4x one while the first `busy` such batches run (a build
    beside the probe), then their quiet cost."""

    def __init__(self, path, busy: int):
        super().__init__(path, {n: 0.002 + 0.002 * n for n in range(1, 9)})
        self.busy = busy

    def eval(self, tokens, *, n_logits):
        if len(tokens) == 2 and self.busy > 0:
            self.busy -= 1
            CLOCK.now += 0.016 - self.seconds[2]  # the quiet cost is added below
        return super().eval(tokens, n_logits=n_logits)


def test_a_probe_on_a_busy_machine_probes_again_and_keeps_only_a_plausible_table(tmp_path):
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    verifier = BusyModel(tmp_path / "v.gguf", busy=3)  # the first try (2 rounds) and the second's first round
    measured = tuning.probe(verifier)
    assert measured.verify[:3] == (0.004, 0.006, 0.008)  # each size's fastest of the tries
    assert sum(len(call) == 2 for call in verifier.eval_calls) == 4  # two tries of two rounds
    assert tuning.stored(verifier) == list(measured.verify)
    # Busy through every try: this run gets the table, tuning.json does not keep it.
    (tmp_path / "w.gguf").write_bytes(b"w" * 10)
    always = BusyModel(tmp_path / "w.gguf", busy=1000)
    assert tuning.probe(always).verify[1] == pytest.approx(0.016)
    assert sum(len(call) == 2 for call in always.eval_calls) == 2 * tuning.PROBE_TRIES
    assert tuning.stored(always) is None
    # Nor is a run's learned table with that shape.
    tuning.keep_learned(always, None, costs.MachineCosts((0.004, 0.016, 0.018)))
    assert tuning.stored(always) is None


def test_benchs_table_is_measured_again_while_the_machine_is_busy(tmp_path):
    """`bench --quick` measures one round: a busy one is measured again, as the probe's is (CI's bench
    on a tiny model met the suite's other workers and kept no table)."""
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    verifier = BusyModel(tmp_path / "v.gguf", busy=1)
    table = tuning.measure_verify(verifier, max_batch=4, repeats=1)
    assert table[:3] == pytest.approx([0.004, 0.006, 0.008]) and costs.disturbed(table) is None
    assert sum(len(call) == 2 for call in verifier.eval_calls) == 2  # one more round, not three


def test_a_stored_table_of_a_busy_machine_is_one_warning_and_measured_again(tmp_path, capsys):
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    verifier = FileModel(tmp_path / "v.gguf", {n: 0.002 + 0.002 * n for n in range(1, 9)})
    _hand_edit(
        tuning.key_for(verifier), [0.0679, 0.2589, 0.2458, 0.3550, 0.4160, 0.5177]
    )  # (as an older version kept it)
    announced = []
    measured = tuning.probe(verifier, on_measure=lambda: announced.append(True))
    assert announced == [True] and measured.verify[:2] == (0.004, 0.006)
    (warning,) = capsys.readouterr().err.splitlines()
    assert "a batch of 2 tokens at 3.8× one token's cost" in warning and "machine was busy" in warning
    assert tuning.stored(verifier) == list(measured.verify)


def test_a_fixed_k_measures_the_drafts_reading_alone_once_and_keeps_it(tmp_path):
    # What a fixed K prices a long catch-up with (Prepared.read_cost): measured without the verify table
    # a fixed K does not use, kept, and read back; the probe's own where it ran.
    (tmp_path / "v.gguf").write_bytes(b"v" * 10)
    (tmp_path / "d.gguf").write_bytes(b"d" * 5)
    verifier = FileModel(tmp_path / "v.gguf", {n: 0.002 + 0.002 * n for n in range(1, 9)})
    draft = FileModel(tmp_path / "d.gguf", {1: 0.002, 32: 0.016})
    resolved = SimpleNamespace(verifier=verifier.path, draft=draft.path, recommended_k=None)
    announced = []
    prepared = Prepared(
        resolved=resolved,
        verifier=verifier,
        draft=draft,
        options=DraftOptions(),
        on_measure=lambda: announced.append(1),
    )
    assert prepared.read_cost() == 0.0005 and announced == [1] and verifier.eval_calls == []
    assert tuning.read_cost(draft, on_measure=pytest.fail) == 0.0005  # kept in tuning.json
    calls = len(draft.eval_calls)
    assert prepared.read_cost() == 0.0005 and len(draft.eval_calls) == calls
    policy, _ = prepared.policy(KChoice("fixed", 4), temperature=0.0, drafter="model")
    assert policy.read_seconds("model") == 0.0005 and policy.read_seconds("ngram") is None
    known = dataclasses.replace(prepared, _costs=costs.MachineCosts((0.004, 0.006), draft=0.002, draft_read=0.0007))
    assert known.read_cost() == 0.0007  # the costs' own measurement where they were probed
    assert Prepared(resolved=resolved, verifier=verifier, draft=None, options=DraftOptions()).read_cost() is None
