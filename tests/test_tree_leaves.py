"""A draft tree never has more leaves than the verifier's `eval_tree` takes (`Model.max_leaves`; llama.cpp:
one sequence per leaf, 16): siblings stop where the next one would pass it."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel, one_hot_logits
from specgguf.core.engine import FixedK, speculate
from specgguf.core.kpolicy import K_MAX
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings

VOCAB = 12


def _next(context: list[int]) -> int:
    return (context[-1] * 5 + 1) % VOCAB


class AlwaysBranch(FixedK):
    """K drafts, each with the draft's runner-up beside it, if the loop lets it."""

    branches = True

    def branch(self, confidences: list[float], runner_up: float) -> bool:
        return True


def _leaves(parents: list[int]) -> int:
    return len(set(range(len(parents))) - set(parents))


@pytest.mark.parametrize("options", [{}, {"max_leaves": 4}], ids=["llama-cpp-16", "4"])
def test_siblings_stop_at_the_verifiers_leaf_limit(options):
    max_leaves = options.get("max_leaves", 16)
    # The fake refuses a tree with more leaves, as LlamaModel does; the draft agrees with the
    # verifier, so every step drafts K_MAX tokens with a sibling asked for beside each.
    verifier = FakeModel(one_hot_logits(_next, VOCAB), n_vocab=VOCAB, **options)
    draft = FakeModel(one_hot_logits(_next, VOCAB), n_vocab=VOCAB)
    events = list(
        speculate(
            verifier=verifier,
            drafter=ModelDrafter(draft),
            prompt_tokens=[1, 2],
            k=AlwaysBranch(K_MAX),
            max_tokens=60,
            settings=SamplingSettings(temperature=0.0),
            rng=np.random.default_rng(0),
        )
    )
    leaves = [_leaves(parents) for _, parents in verifier.tree_calls]
    assert leaves and max(leaves) == max_leaves  # as many siblings as fit, and no more
    assert events[1].n_siblings == max_leaves - 1 and events[1].chain_drafted == K_MAX  # (0: the prompt pass's)
    output = [token for event in events for token in event.tokens]
    expected = [2]
    for _ in range(60):
        expected.append(_next(expected))
    assert output == expected[1:]
