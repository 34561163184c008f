"""Several requests stepping together (`serve --parallel N`): what each is charged for a shared pass,
how a lane's K policy is priced for the lanes live, and the round's K (kpolicy.round_k)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from specgguf.core.costs import MachineCosts, StepCosts
from specgguf.core.engine import FixedK, StepEvent
from specgguf.core.kpolicy import AdaptiveK, adaptive_policy
from specgguf.core.lane_policy import SharedCosts
from specgguf.core.rounds import ALONE, FREE, Line, Round, lone_k, reprice, round_k
from specgguf.llama.batcher import Batcher, Rows, SequenceView
from specgguf.llama.sequences import PassCosts, passes as llama_passes
from specgguf.serve.parallel import lanes as lanes_module
from specgguf.serve.parallel.lanes import Lanes
from test_kpolicy import _step

TABLE = MachineCosts(verify=(0.100, 0.110, 0.120, 0.130, 0.140, 0.150), draft=0.010)


class SleepingDecoder:
    """A decoder whose pass takes `seconds`: what the batcher shares out."""

    n_batch = 64

    def __init__(self, seconds: float):
        self.seconds = seconds

    def decode(self, work):
        time.sleep(self.seconds)
        return [np.zeros((rows.n_logits, 4), dtype=np.float32) for rows in work]

    def remove(self, seq: int, start: int) -> None:
        pass

    def pass_line(self) -> tuple[float, float] | None:
        return None


def test_callers_of_one_pass_share_its_time_by_their_rows():
    batcher = Batcher(SleepingDecoder(0.2), wait_seconds=5.0)
    work = [Rows(0, 0, [1], 1), Rows(1, 0, [1, 2, 3], 3)]
    ready = threading.Barrier(2)

    def call(rows: Rows) -> None:
        with batcher.participant():
            ready.wait()
            batcher.run(rows)

    threads = [threading.Thread(target=call, args=(rows,)) for rows in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert batcher.n_decodes == 1  # one pass for both
    assert np.isclose(work[1].seconds, 3 * work[0].seconds)
    assert 0.2 <= work[0].seconds + work[1].seconds < 0.5


def test_pass_costs_recover_the_fixed_and_the_per_row_cost():
    costs = PassCosts()
    assert costs.line() is None  # nothing measured
    for rows in [4, 4, 4, 4, 4, 4, 4, 4]:
        costs.observe(rows, 0.120 + 0.015 * rows)
    assert costs.line() is None  # one size only: a and b cannot be told apart
    for rows in [1, 4, 8, 2, 16, 5, 3, 12, 1, 9]:
        costs.observe(rows, 0.120 + 0.015 * rows)
    a, b = costs.line()
    assert abs(a - 0.120) < 1e-9 and abs(b - 0.015) < 1e-9
    # Decodes llama.cpp cut into several passes (a sequence per cache: sequences.passes) pay a per pass.
    costs = PassCosts()
    for passes, rows in [(3, 13), (2, 8), (3, 13), (2, 12), (1, 4), (3, 16), (2, 8), (2, 6)]:
        costs.observe(rows, 0.120 * passes + 0.015 * rows, passes)
    a, b = costs.line()
    assert abs(a - 0.120) < 1e-9 and abs(b - 0.015) < 1e-9


def test_a_prompts_pass_does_not_bend_the_line_and_a_failed_refit_keeps_the_last():
    costs = PassCosts()
    for rows in [1, 4, 8, 16] * 2:
        costs.observe(rows, 0.080 + 0.015 * rows)
    line = costs.line()
    costs.observe(173, 5.4)  # four prompts at once, on one thread while the client started
    assert costs.line() == line
    for _ in range(8):  # rounds gone strange (a 4-row pass slower than a 16-row one): no line fits
        costs.observe(4, 0.400)
        costs.observe(16, 0.100)
    assert costs.line() == line


def test_a_lane_among_four_pays_a_quarter_of_the_pass_and_its_own_rows():
    shared = Round(4, Line(0.120, 0.015), Line(0.020, 0.005)).prices(TABLE, 8)
    assert np.allclose(shared.verify[:3], [(0.120 + 0.015 * 4 * (k + 1)) / 4 for k in range(3)])
    assert np.isclose(shared.draft, (0.020 + 0.005 * 4) / 4)
    # Before any pass is measured: the table's cost of as many rows of one sequence, split 4 ways.
    assert np.isclose(Round(4).prices(TABLE, 8).verify[0], TABLE.verify[3] / 4)


def test_step_costs_priced_for_the_lanes_live_forget_what_other_lanes_taught():
    costs = StepCosts(TABLE, trust=3)
    event = _step(1, 1, verify=0.5, draft=0.01)
    for _ in range(10):
        costs.observe(event)
    assert costs.verify(np.array([1]))[0] > 0.3  # learned: verifying is slow here
    four = Round(4, Line(0.120, 0.015), None)
    assert reprice(costs, ALONE, four, 8)
    assert np.isclose(costs.verify(np.array([0]))[0], (0.120 + 0.015 * 4) / 4)  # the lanes' prior, fresh
    assert not reprice(costs, four, Round(4), 8)  # as many lanes: nothing forgotten
    assert reprice(costs, Round(4), ALONE, 8) and np.allclose(costs.table, TABLE.verify)  # alone: the machine's table


def test_a_policy_priced_for_shared_passes_keeps_no_learned_costs():
    policy = AdaptiveK(TABLE)
    for _ in range(40):
        policy.observe(_step(1, 1, verify=0.5, draft=0.01))
    assert policy.learned_costs() is not None
    policy.share(Round(4, Line(0.120, 0.015), None))
    assert policy.learned_costs() is None  # a share of shared passes is not the machine's cost


def test_a_round_drafts_where_a_pass_is_memory_bound_and_not_where_rows_cost_compute():
    def expected(acceptance: float) -> np.ndarray:  # E(k), k = 0..16
        return np.concatenate([[1.0], 1.0 + np.cumsum(acceptance ** np.arange(1, 17))])

    fair, sure, draft = expected(0.6), expected(0.9), Line(0.005, 0.001)
    memory_bound = Line(per_pass=0.500, per_row=0.002)  # a big model's weights read once a pass
    compute_bound = Line(per_pass=0.100, per_row=0.030)  # each row costs a third of a pass
    assert round_k([fair] * 4, n_lanes=4, verify=memory_bound, draft=draft) >= 3
    assert round_k([fair] * 4, n_lanes=4, verify=compute_bound, draft=draft) == 0
    assert round_k([sure] * 4, n_lanes=4, verify=compute_bound, draft=draft) >= 1  # drafts right 9 times in 10
    # More lanes, more rows per drafted position: never a longer round.
    ks = [round_k([sure] * n, n_lanes=n, verify=Line(0.100, 0.010), draft=draft) for n in (1, 2, 4, 8)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]


def _sequence(line: Line | None, n_lanes: int) -> Any:
    """A lane's sequence as its policy reads it (batcher.SequenceView): passes on `line`, n lanes live."""
    return SimpleNamespace(
        charged_seconds=0.0,
        pass_line=lambda: None if line is None else (line.per_pass, line.per_row),
        batcher=SimpleNamespace(n_participants=n_lanes),
    )


def _fresh_lanes(line: Line, draft: Line, n: int = 4) -> tuple[list[AdaptiveK], set[SharedCosts]]:
    """n fresh requests' policies, live together on lanes whose passes cost `line` and `draft`."""
    verifier, drafts = _sequence(line, n), _sequence(draft, n)
    live: set[SharedCosts] = set()
    policies = [AdaptiveK(TABLE) for _ in range(n)]
    for policy in policies:
        live.add(SharedCosts(policy, verifier, drafts, live))
    return policies, live


def test_fresh_lanes_do_not_explore_a_round_that_would_lose_even_with_drafts_right_nine_times_in_ten():
    """Optimism about a fresh request's drafts stops at `worth_trying` (9 in 10), as a lone policy's
    could_win: on this line a round of four would need drafts right every time, so it never drafts
    to find out (the draft model's first step would read every lane's tokens: a second here)."""
    line, draft = Line(0.100, 0.012), Line(0.015, 0.003)
    policies, live = _fresh_lanes(line, draft)
    unbounded = [policy.acceptance.expected(policy.config.doubt) for policy in policies]
    assert round_k(unbounded, n_lanes=4, verify=line, draft=draft) >= 1  # what drafted before
    assert round_k([shared.expected("model") for shared in live], n_lanes=4, verify=line, draft=draft) == 0
    for policy in policies:  # drafts seen right 19 times in 20: the learned rate counts, beyond the cap
        for step in range(8):
            policy.acceptance.observe(1, int(step > 0), [])
    learned = [shared.expected("model") for shared in live]
    assert all(e[1] >= policy.acceptance.expected()[1] for e, policy in zip(learned, policies))


def test_a_lone_draft_is_priced_by_the_pass_or_the_fillers_it_adds_to_the_round():
    """An n-gram match is one request's: among four lanes its drafts cost filler rows for the other
    three, or a pass of their own, and gain only its own tokens. On the F16 line measured here that
    never pays, where pricing the round as if all four drafted (round_k) did; alone it still drafts."""
    line = Line(0.096, 0.0146)  # the F16 1.5B here with four lanes, per pass and per row
    fair = np.cumsum(0.8 ** np.arange(9))  # E(k) of an n-gram right 8 times in 10
    sure = np.arange(1.0, 10.0)  # ... always right (a forced run)
    assert round_k([fair] * 4, n_lanes=4, verify=line, draft=FREE) >= 1  # what a lone n-gram draft was priced by
    assert lone_k(fair, n_lanes=4, verify=line, draft=FREE) == 0
    assert lone_k(fair, n_lanes=1, verify=line, draft=FREE) >= 3  # alone, the very rows it adds
    assert lone_k(sure, n_lanes=4, verify=line, draft=FREE) >= 1  # sure tokens are still worth their rows
    ks = [lone_k(fair, n_lanes=n, verify=line, draft=FREE) for n in (1, 2, 3, 4)]
    assert ks == sorted(ks, reverse=True)
    # The price is llama.cpp's: a lane's k + 1 rows among three single rows take a pass of their own.
    a, b = line.per_pass, line.per_row
    for seq in range(4):
        rows = {other: 1 for other in range(4)} | {seq: 4}
        assert np.isclose(sum(a + b * n for n in llama_passes(rows)), (a + b * 4) + (a + b * 3))


def test_a_hybrid_lane_among_four_steps_plain_on_its_ngram_match_and_alone_drafts_it():
    line = Line(0.096, 0.0146)

    chosen = {}
    for n_lanes in (1, 4):
        policy = adaptive_policy("hybrid", TABLE)
        for _ in range(40):  # its n-gram drafts are right 8 times in 10
            policy.policies["ngram"].acceptance.observe(4, 3, [])
        live: set[SharedCosts] = set()
        shared = SharedCosts(policy, _sequence(line, n_lanes), _sequence(Line(0.0225, 0.0031), n_lanes), live)
        live.add(shared)
        chosen[n_lanes] = shared.choose("ngram")
    assert chosen[1] >= 2 and chosen[4] == 0


def test_a_lanes_policy_learns_its_share_not_the_wall_time():
    verifier, draft = _sequence(None, 1), _sequence(None, 1)
    policy = AdaptiveK(TABLE)
    seen: list[StepEvent] = []
    policy.observe = seen.append
    shared = SharedCosts(policy, verifier, draft, set())
    shared.choose("model")
    verifier.charged_seconds, draft.charged_seconds = 0.030, 0.004  # this lane's share of the passes
    wall = _step(2, 0, verify=0.400, draft=0.010)
    shared.observe(replace(wall, draft_catchup_seconds=0.010))
    (event,) = seen
    assert (event.verify_seconds, event.draft_seconds) == (0.030, 0.004)
    assert np.isclose(event.draft_catchup_seconds, 0.002)  # the catch-up's part of the draft time, in the same share


def test_a_step_that_asked_for_no_k_is_charged_its_own_pass_not_the_ones_before():
    """The engine steps without asking for K while a draft model's reading waits (core/drafting.py), and
    the prompt's pass is charged before an answer's first step. Measured in the agent trace's first
    turns: plain steps charged 33, 66, 100, … ms (every pass since the last K asked) and the first one
    the prompt's 6.4 s, so the learned costs made a plain step look 7× its price and the draft model,
    which cannot win on that verifier, drafted for a whole 512-token answer at 0.65× plain."""
    verifier, draft = _sequence(None, 1), _sequence(None, 1)
    policy = AdaptiveK(TABLE)
    seen: list[StepEvent] = []
    policy.observe = seen.append
    shared = SharedCosts(policy, verifier, draft, set())
    verifier.charged_seconds = 6.4  # the prompt's pass
    for _ in range(3):  # three plain steps, no K asked
        verifier.charged_seconds += 0.033
        shared.observe(_step(0, 0, verify=0.034, draft=0.0))
    assert [round(event.verify_seconds, 3) for event in seen] == [0.034, 0.033, 0.033]


def test_a_round_of_fresh_lanes_drafts_until_their_drafts_are_known_to_lose():
    """A fresh request's acceptance is unknown (the prior's 0.5): priced at it, four lanes on this
    memory-bound line would never draft, so they would never learn otherwise. Over each lane's first
    `evidence` drafts the round prices them as a lone policy does (optimistic); once they are known
    to lose, plain steps."""
    line, draft = Line(0.127, 0.011), Line(0.015, 0.003)  # the F16 1.5B and the 0.5B here, per pass and row
    policies, live = _fresh_lanes(line, draft)
    fresh = [shared.expected("model") for shared in live]
    assert round_k(fresh, n_lanes=4, verify=line, draft=draft) >= 1
    plain = [policy.acceptance.expected() for policy in policies]  # what the prior alone says
    assert round_k(plain, n_lanes=4, verify=line, draft=draft) == 0
    for policy in policies:  # their first drafts are mostly wrong
        for step in range(policy.config.evidence):
            policy.acceptance.observe(2, int(step % 4 == 0), [])
    assert round_k([shared.expected("model") for shared in live], n_lanes=4, verify=line, draft=draft) == 0


class _RecordingDecoder(SleepingDecoder):
    """A sleeping decoder that records each batch's sequences."""

    def __init__(self, seconds: float, batches: list[list[int]]):
        super().__init__(seconds)
        self.batches = batches

    def decode(self, work):
        self.batches.append(sorted(rows.seq for rows in work))
        return super().decode(work)


class _RecordingModel:
    """A model whose sequences share one batcher over a decoder that records each batch's sequences."""

    def __init__(self, seconds: float = 0.005):
        self.batches: list[list[int]] = []
        self.decoder = _RecordingDecoder(seconds, self.batches)

    def sequences(self, n_seq: int, wait_seconds: float = 0.0, calibrate: bool = False):
        batcher = Batcher(self.decoder, wait_seconds=0.5)
        return [SequenceView(batcher, seq, n_ctx=4096, n_vocab=4, is_eog=lambda token: False) for seq in range(n_seq)]


def _request(lanes: Lanes, prompt: list[int], steps: int, *, fim: bool = False, started=None) -> None:
    """A request's thread as the server runs it (serve/generator.py): between its steps it may give way;
    each step chooses K, then decodes a row."""
    lane = lanes.acquire(prompt, fim=fim)
    try:
        with lane.live(), lanes.shared(FixedK(0), lane) as policy:
            lane.verifier.eval(prompt, n_logits=1)
            for step in range(steps):
                lanes.between_steps(lane)
                policy.choose("model")
                lane.verifier.eval([step], n_logits=1)
                if started is not None and step == 2:
                    started.set()
    finally:
        lanes.release(lane)


def test_a_chat_gives_way_to_an_editors_completion_and_then_goes_on():
    """While a fill-in-the-middle request runs, the chat's rows stay out of its passes (it waits
    between its steps, out of the batches); afterwards the chat goes on and ends."""
    model = _RecordingModel()
    lanes = Lanes(model, None, 2)
    streaming = threading.Event()
    chat = threading.Thread(target=_request, args=(lanes, [1, 2, 3], 60), kwargs={"started": streaming})
    chat.start()
    assert streaming.wait(10)
    before = len(model.batches)
    _request(lanes, [7, 8, 9], 10, fim=True)
    during = model.batches[before:]
    chat.join(10)
    assert not chat.is_alive()
    fim_seq = 1 - min(seq for batch in model.batches[:before] for seq in batch)  # the chat took the other
    fim_batches = [batch for batch in during if fim_seq in batch]
    assert len(fim_batches) == 11  # its prompt and its ten steps
    assert sum(1 for batch in fim_batches if len(batch) > 1) <= 1  # at most the pass the chat was in
    assert sum(len(batch) for batch in model.batches) == 60 + 1 + 11  # the chat's every step ran too


def test_a_chat_waits_at_most_give_way_seconds_then_steps(monkeypatch):
    """A stream of completions never stops a chat: after GIVE_WAY seconds it takes a step."""
    monkeypatch.setattr(lanes_module, "GIVE_WAY", 0.05)
    model = _RecordingModel(seconds=0.01)
    lanes = Lanes(model, None, 2)
    streaming = threading.Event()
    chat = threading.Thread(target=_request, args=(lanes, [1, 2, 3], 20), kwargs={"started": streaming})
    chat.start()
    assert streaming.wait(10)
    fim = threading.Thread(target=_request, args=(lanes, [7, 8, 9], 400), kwargs={"fim": True})
    fim.start()
    chat.join(30)
    assert not chat.is_alive() and fim.is_alive()  # the chat ended while the long completion ran
    fim.join(30)


@pytest.mark.parametrize("bound", ["tokens", "seconds"])
def test_a_long_completion_goes_first_only_for_its_first_tokens_or_seconds(monkeypatch, bound):
    """An editor's completion goes first for its first PRIORITY_TOKENS tokens and PRIORITY_SECONDS,
    then steps like any request: a short chat beside a completion of hundreds of tokens ends long
    before it (it took a step a second while the completion ran: 16 tokens in 12.9 s instead of 1.4)."""
    if bound == "seconds":
        monkeypatch.setattr(lanes_module, "PRIORITY_TOKENS", 10**6, raising=False)
        monkeypatch.setattr(lanes_module, "PRIORITY_SECONDS", 0.5, raising=False)
    model = _RecordingModel(seconds=0.01)
    lanes = Lanes(model, None, 2)
    streaming = threading.Event()
    chat = threading.Thread(target=_request, args=(lanes, [1, 2, 3], 16), kwargs={"started": streaming})
    chat.start()
    assert streaming.wait(10)
    before = len(model.batches)
    fim = threading.Thread(target=_request, args=(lanes, [7, 8, 9], 300), kwargs={"fim": True})
    fim.start()
    chat.join(30)
    assert not chat.is_alive()
    assert fim.is_alive()  # the chat ended long before the completion (300 passes of 10 ms)
    fim_seq = 1 - min(seq for batch in model.batches[:before] for seq in batch)
    first = [batch for batch in model.batches[before:] if fim_seq in batch][:40]
    assert sum(1 for batch in first if len(batch) > 1) <= 1  # it went first, at the start
    fim.join(30)
    assert not fim.is_alive()


def test_short_completions_one_after_another_do_not_starve_a_chat():
    """Two editors' short completions, always one running: the chat waits at most GIVE_WAY seconds
    at a time, then steps for as long as it waited (it took a step a second: a 32-token chat took
    40.1 s instead of 6.7)."""
    model = _RecordingModel(seconds=0.01)
    lanes = Lanes(model, None, 3)
    streaming, done = threading.Event(), threading.Event()

    def editor(prompt: list[int]) -> None:
        while not done.is_set():
            _request(lanes, prompt, 20, fim=True)

    chat = threading.Thread(target=_request, args=(lanes, [1, 2, 3], 40), kwargs={"started": streaming})
    chat.start()
    assert streaming.wait(10)
    editors = [threading.Thread(target=editor, args=([7, 8, index],)) for index in range(2)]
    started = time.monotonic()
    for thread in editors:
        thread.start()
        time.sleep(0.1)  # out of step: one editor's completion starts while the other's runs
    chat.join(20)
    elapsed = time.monotonic() - started
    done.set()
    for thread in editors:
        thread.join(30)
    chat.join(60)
    assert elapsed < 5.0  # alone: 40 passes of 10 ms; held back at most half of the time
