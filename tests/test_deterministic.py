"""`serve --deterministic`: a request's rows go in passes of their own (the batcher never puts another
caller's rows beside them, and its thread is no participant the others wait for), and its adaptive K
follows from its tokens alone (core/repeatable.py), not from the clock; the live test in
tests/test_deterministic_live.py checks the property the docs state on the default pair."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from fakes import FakeModel, one_hot_logits
from live_server import live_server
from specgguf.core import engine
from specgguf.core.costs import MachineCosts
from specgguf.core.drafting import LONG_READ
from specgguf.core.engine import FixedK, StepEvent, speculate
from specgguf.core.kpolicy import PolicyConfig, adaptive_policy
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.repeatable import Repeatable, repeatable, table_seconds
from specgguf.core.sampling import SamplingSettings
from specgguf.llama.batcher import Batcher, Rows, SequenceView
from specgguf.serve.common import Speculative
from specgguf.serve.parallel.lanes import Lane, Lanes
from test_laws import DRAFT, TARGET, VOCAB
from test_parallel_laws import PROMPTS, FakeContext
from test_serve_parallel import _Views as _FakeViews

ALONE = 0  # the lane whose request is deterministic
COSTS = MachineCosts(verify=(0.040, 0.046, 0.052, 0.058, 0.064, 0.070), draft=0.012)


class RecordingContext(FakeContext):
    """A FakeContext that keeps each batch's sequences."""

    def __init__(self, table: np.ndarray):
        super().__init__(table)
        self.batches: list[set[int]] = []

    def decode(self, work: Sequence[Rows]) -> list[np.ndarray]:
        self.batches.append({rows.seq for rows in work})
        return super().decode(work)


def _views(context: FakeContext, *, wait_seconds: float) -> list[SequenceView]:
    batcher = Batcher(context, wait_seconds=wait_seconds)
    return [
        SequenceView(batcher, seq, n_ctx=4096, n_vocab=VOCAB, is_eog=lambda _token: False)
        for seq in range(len(PROMPTS))
    ]


def test_a_deterministic_request_never_shares_a_pass_and_the_others_still_do():
    """Three requests at once, lane 0 deterministic: no batch of either model holds its rows beside
    another's; the other two share batches; each gets its own greedy answer. The verifier's batcher
    waits 10 s for its participants: were the deterministic thread one, or its calls waited for, the
    run would take minutes."""
    contexts = [RecordingContext(TARGET), RecordingContext(DRAFT)]
    verifiers, drafts = (_views(context, wait_seconds=10.0) for context in contexts)
    answers: dict[int, list[list[int]]] = {lane: [] for lane in range(len(PROMPTS))}
    errors: list[BaseException] = []
    everyone_in = threading.Barrier(len(PROMPTS))

    def answer(lane: int) -> None:
        lanes = Lane(lane, verifiers[lane], drafts[lane])
        try:
            with lanes.live(alone=lane == ALONE):
                everyone_in.wait(timeout=60)
                for _ in range(12):
                    events = speculate(
                        verifier=verifiers[lane],
                        drafter=ModelDrafter(drafts[lane]),
                        prompt_tokens=PROMPTS[lane],
                        k=FixedK(3),
                        max_tokens=6,
                        settings=SamplingSettings(temperature=0),
                        rng=np.random.default_rng(lane),
                    )
                    answers[lane].append([token for event in events for token in event.tokens])
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=answer, args=(lane,)) for lane in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for lane, prompt in enumerate(PROMPTS):
        expected, previous = [], prompt[-1]
        for _ in range(6):
            previous = int(np.argmax(TARGET[previous]))
            expected.append(previous)
        assert answers[lane] == [expected] * 12
    for context in contexts:
        assert any(ALONE in batch for batch in context.batches)
        assert all(batch == {ALONE} for batch in context.batches if ALONE in batch)
        assert any(len(batch) > 1 for batch in context.batches)  # the other two still go together
    assert all(not view.alone for view in (*verifiers, *drafts))  # the lane is shared again after
    assert all(view.batcher.n_participants == 0 for view in (*verifiers, *drafts))


def _events(verify_seconds: float) -> list[StepEvent]:
    """Steps of 4 drafts with 2 kept, then 3 of 4 drafts all refused, timed as `verify_seconds`."""
    kept = [StepEvent([1, 2], [3, 4], 5, 4, 2, 0.05, verify_seconds, 0.001, draft_source="model")] * 8
    refused = [StepEvent([], [1, 2, 3, 4], 5, 4, 0, 0.05, verify_seconds, 0.001, draft_source="model")] * 3
    return kept + refused + kept


def _choices(policy, events: list[StepEvent]) -> list[int]:
    """The length the policy lets a draft reach before each step, as it observes them: K (a draft
    model's is a cap), cut where `keep_drafting` stops drafts of confidence 0.8."""
    choices = []
    for event in events:
        k = policy.choose("model")
        choices.append(next((n for n in range(1, k + 1) if not policy.keep_drafting([0.8] * n)), k) if k else 0)
        policy.observe(event)
    return choices


def _policy():
    return adaptive_policy("model", COSTS, PolicyConfig(cost_trust=1))


def test_a_repeatable_policy_chooses_the_same_k_whatever_the_clock_said():
    """The same steps timed by a quiet machine and by a busy one (shared passes, another client's
    rows): the policy timed by the clock chooses other K (the check is sharp), the repeatable one the same."""
    quiet, busy = _events(0.06), _events(1.5)
    assert _choices(_policy(), quiet) != _choices(_policy(), busy)
    assert _choices(Repeatable(_policy(), COSTS), quiet) == _choices(Repeatable(_policy(), COSTS), busy)
    assert Repeatable(_policy(), COSTS).learned_costs() is None


def test_the_table_times_a_pass_past_its_end_by_its_last_slope():
    assert table_seconds(COSTS, 1) == COSTS.verify[0]
    assert table_seconds(COSTS, 6) == COSTS.verify[5]
    assert abs(table_seconds(COSTS, 8) - (0.070 + 2 * 0.006)) < 1e-12


def test_a_request_asks_for_it_in_its_speculative_object():
    assert Speculative.model_validate({"deterministic": True}).speculation().deterministic is True
    assert Speculative.model_validate({}).speculation().deterministic is None  # the server's --deterministic


def _hold(lane: Lane, tokens: list[int], *, used: float) -> None:
    lane.verifier.cached, lane.verifier.n_past = list(tokens), len(tokens)
    lane.prompt, lane.used = list(tokens[:-2]), used


def test_a_request_that_keeps_no_cache_takes_the_least_recently_used_lane():
    """A deterministic request empties its lane first: past its own conversation and an empty lane it
    takes the least recently used one, not the one whose cache it shares most of (another's, kept)."""

    def two_lanes() -> Lanes:
        lanes = Lanes(_FakeViews(), None, 2)
        _hold(lanes.lanes[0], [1, 2, 3, 4, 5, 6, 8, 8], used=1.0)  # shares most with the request, used last
        _hold(lanes.lanes[1], [9, 9, 9, 9], used=0.0)
        return lanes

    lanes = two_lanes()
    assert lanes.acquire([1, 2, 3, 7], fresh=True) is lanes.lanes[1]
    lanes = two_lanes()
    assert lanes.acquire([1, 2, 3, 7]) is lanes.lanes[0]  # a request that keeps its cache: the one it shares


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_a_deterministic_server_reads_each_prompt_whole(tiny_verifier, tiny_draft, parallel):
    """With --parallel 1 (the models' own caches) and 2 (lanes): the same greedy request twice gets the
    same answer and its prompt read whole the second time (no cached tokens); a request that asks out
    of it (`"deterministic": false`) keeps the cache."""
    args = ("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "--parallel", parallel, "--deterministic")
    with live_server(*args) as server:
        client = server.client()

        def complete(**speculative):
            response = client.completions.create(
                model="m",
                prompt="the cat sat on the mat and the dog",
                max_tokens=24,
                temperature=0,
                extra_body={"speculative": speculative} if speculative else None,
            )
            return response.choices[0].text, response.usage.prompt_tokens_details.cached_tokens

        first, second = complete(), complete()
        assert first[0] == second[0] and second[1] == 0
        assert complete(deterministic=False)[1] > 0


LONG_PROMPT = [1 + i % 8 for i in range(LONG_READ + 40)]  # more than a draft model reads at once


def _steps(policy, monkeypatch, *, tick: float) -> list[tuple[str | None, int]]:
    """A greedy answer after a long prompt the draft has not read, on a clock that moves `tick` seconds
    each time it is read: (who drafted, how many) at each step."""
    now = iter(tick * i for i in range(1_000_000))
    monkeypatch.setattr(engine, "time", SimpleNamespace(perf_counter=lambda: next(now)))
    verifier = FakeModel(one_hot_logits(lambda c: c[-1] % 8 + 1, 12), n_vocab=12, n_ctx=512)
    draft = FakeModel(one_hot_logits(lambda c: c[-1] % 8 + 1, 12), n_vocab=12, n_ctx=512)
    events = speculate(
        verifier=verifier,
        drafter=ModelDrafter(draft),
        prompt_tokens=LONG_PROMPT,
        k=policy,
        max_tokens=90,
        settings=SamplingSettings(temperature=0.0),
        rng=np.random.default_rng(0),
    )
    return [(event.draft_source, event.n_drafted) for event in events]


def test_when_a_deterministic_requests_draft_reads_a_long_prompt_does_not_follow_the_clock(monkeypatch):
    """The draft model reads a long prompt it has not read once the answer has run as long as the reading
    costs (drafting.Reading): counted by the clock, a busy machine (another client's passes between the
    request's steps) makes it read earlier and the verify passes take other shapes. A repeatable policy
    counts the steps as the costs time them: the same steps, whatever the clock said."""
    costs = replace(COSTS, draft_read=0.004)  # 104 unread tokens: 0.42 s of reading
    quiet, busy = 0.0005, 0.05
    clocked = [_steps(adaptive_policy("model", costs, PolicyConfig()), monkeypatch, tick=t) for t in (quiet, busy)]
    assert clocked[0] != clocked[1]  # the check is sharp: by the clock, the busy run reads sooner
    same = [
        _steps(Repeatable(adaptive_policy("model", costs, PolicyConfig()), costs), monkeypatch, tick=t)
        for t in (quiet, busy)
    ]
    assert same[0] == same[1]
    assert ("model", 0) not in same[0] and any(source == "model" for source, _ in same[0])  # it does read, later
    # A fixed K's draft waits for its reading the same way (its rent each second whole): a deterministic
    # request's is wrapped too (`repeatable`, what the server's planner asks for).
    fixed = [_steps(FixedK(3, read_seconds=0.004), monkeypatch, tick=t) for t in (quiet, busy)]
    assert fixed[0] != fixed[1]
    fixed = [
        _steps(repeatable(FixedK(3, read_seconds=0.004), lambda: costs), monkeypatch, tick=t) for t in (quiet, busy)
    ]
    assert fixed[0] == fixed[1] and any(source == "model" for source, _ in fixed[0])


def test_a_deterministic_request_is_timed_by_the_costs_wherever_the_clock_could_steer_it():
    def costs():
        return COSTS

    assert isinstance(repeatable(_policy(), costs), Repeatable)  # an adaptive K
    assert isinstance(repeatable(FixedK(4), costs), Repeatable)  # a draft model's reading
    plain = FixedK(0)
    assert repeatable(plain, lambda: pytest.fail("measured costs for plain decoding")) is plain
