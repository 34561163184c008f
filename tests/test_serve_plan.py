"""serve/plan.py's policies: an adaptive K policy belongs to the live sequence a request runs on
(serve --parallel's lane), not to the worker thread that happens to take the request."""

from __future__ import annotations

from types import SimpleNamespace

from specgguf.core.sampling import SamplingSettings
from specgguf.kchoice import KChoice
from specgguf.prepare import DraftOptions
from specgguf.serve.plan import GenerationRequest, Limits, Planner, RequestPrompt, RequestSampling, Speculation


class _Prepared:
    """What the planner asks of the loaded pair: each policy it makes is a new object, each drafter
    records the draft view it drafts with."""

    def __init__(self) -> None:
        self.verifier = SimpleNamespace(n_vocab=100, n_ctx=512)
        self.draft = SimpleNamespace(name="the draft model")
        self.options = DraftOptions()
        self.made: list[object] = []

    def policy(self, choice, *, temperature, drafter=None, config=None):
        self.made.append(SimpleNamespace(choice=choice, temperature=temperature))
        return self.made[-1], None

    def drafter(self, kind=None, *, p_min=None, session=None, draft=None):
        return SimpleNamespace(kind=kind, draft=self.draft if draft is None else draft)


def _request(tokens: list[int], *, k: KChoice | None = None) -> GenerationRequest:
    return GenerationRequest(
        RequestPrompt(tokens=tokens), RequestSampling(SamplingSettings(temperature=0.0)), Limits(16), Speculation(k=k)
    )


def test_a_lanes_adaptive_policy_is_the_one_its_earlier_requests_taught():
    prepared = _Prepared()
    planner = Planner(prepared=prepared, templates=None, tool_family=None)
    views = [SimpleNamespace(name=f"lane {i}'s draft") for i in range(3)]
    # An editor's completions, one after another on lane 2 (whichever thread runs each): one policy
    # goes on learning across them, as a server of one sequence's does.
    on_two = [planner.on_lane(planner.plan(_request([1, 2, 3 + i])), 2, views[2]) for i in range(3)]
    assert len({id(plan.policy) for plan in on_two}) == 1
    assert all(plan.drafter.draft is views[2] for plan in on_two)  # drafting with the lane's view
    # Another lane's conversation learns its own.
    on_one = planner.on_lane(planner.plan(_request([7, 8])), 1, views[1])
    assert on_one.policy is not on_two[0].policy and on_one.drafter.draft is views[1]
    assert on_two[0].policy is planner.on_lane(planner.plan(_request([1, 2])), 2, views[2]).policy
    # A fixed K is a request's own, new each time.
    fixed = [planner.on_lane(planner.plan(_request([1, 2], k=KChoice("fixed", 3))), 2, views[2]) for _ in range(2)]
    assert fixed[0].policy is not fixed[1].policy and fixed[0].policy.choice == KChoice("fixed", 3)
