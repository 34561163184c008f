"""Draft trees on the real backend are exact: after `keep_path`, what the verifier scores next is what
a linear evaluation of the same context scores (llama/tree.py says why that takes care), and greedy
tree decoding through `speculate` emits the verifier's argmax of a linear evaluation at every step."""

from __future__ import annotations

import numpy as np
import pytest

from specgguf.core.drafting import Drafts
from specgguf.core.engine import FixedK, VerifyTree, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.llama.model import LlamaModel

GREEDY = SamplingSettings(temperature=0.0)
CONTEXT = [1, 20, 30, 40, 50, 60, 70, 80]  # the last one is the verifier's pending token
CHAIN = [101, 102, 103, 104]
SIBLING = [201, 202, 203, 204]  # the sibling beside CHAIN[i]
PROBE = 42  # the verifier's next token, scored after the kept path
# Where the engine's trees put siblings (model_drafter.py: each right after its chain draft).
SIBLING_DEPTHS = [{0}, {1}, {3}, {0, 2}, {0, 1, 2, 3}]


def _drafts(sibling_depths: set[int]) -> Drafts:
    """A chain of CHAIN, with SIBLING[i] beside CHAIN[i] at each of `sibling_depths`."""
    drafts, parent = Drafts(), -1
    for depth, token in enumerate(CHAIN):
        node = drafts.add(token, parent, None)
        if depth in sibling_depths:
            drafts.sides[drafts.add(SIBLING[depth], parent, None)] = 0.5
        parent = node
    return drafts


def _paths(drafts: Drafts, sibling_depths: set[int]) -> list[list[int]]:
    """Every path the engine may keep: each chain prefix, and each sibling after the chain before it."""
    chain = [node for node in range(len(drafts.tokens)) if node not in drafts.sides]
    paths = [chain[:n] for n in range(len(chain) + 1)]
    sibling = {depth: node for depth, node in zip(sorted(sibling_depths), sorted(drafts.sides))}
    return paths + [chain[:depth] + [sibling[depth]] for depth in sorted(sibling_depths)]


class Linear:
    """What a model scores after a context evaluated as one chain from an empty cache (memoized)."""

    def __init__(self, model: LlamaModel):
        self.model = model
        self.rows: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, tokens: list[int]) -> np.ndarray:
        if tuple(tokens) not in self.rows:
            self.model.rewind(0)
            self.rows[tuple(tokens)] = self.model.eval(tokens, n_logits=1)[0]
        return self.rows[tuple(tokens)]


@pytest.mark.parametrize("n_pending", [1, 2])
@pytest.mark.parametrize("model_file", ["tiny_verifier", "smollm2"])
def test_after_keep_path_the_next_logits_are_a_linear_evaluations(model_file, n_pending, request):
    path_file = request.getfixturevalue(model_file)
    model = LlamaModel(path_file, n_ctx=64, n_threads=1)
    linear = Linear(LlamaModel(path_file, n_ctx=64, n_threads=1))
    cached = CONTEXT[:-n_pending]
    model.eval(cached, n_logits=0)
    for depths in SIBLING_DEPTHS:
        drafts = _drafts(depths)
        for path in _paths(drafts, depths):
            tree = VerifyTree.build(CONTEXT[-n_pending:], drafts)
            model.rewind(len(cached))
            model.eval_tree(tree.tokens, tree.parents, n_logits=tree.n_rows)
            model.keep_path(tree.kept(path))
            context = CONTEXT + [drafts.tokens[node] for node in path]
            assert model.cached == context[: model.n_past]
            n_kept = model.n_past
            # The caller feeds what was not kept with the next token, as the engine does.
            got = model.eval(context[n_kept:] + [PROBE], n_logits=1)[0]
            expected = linear(context + [PROBE])
            where = f"siblings at {sorted(depths)}, kept {[drafts.tokens[node] for node in path]}"
            np.testing.assert_allclose(got, expected, atol=1e-3 * np.abs(expected).max(), err_msg=where)
            # Nothing is evaluated twice without need: a chain prefix stays whole, a sibling end
            # all but the sibling.
            assert n_kept == len(context) - (bool(path) and path[-1] in drafts.sides), where


class AlwaysBranch(FixedK):
    """K drafts, each with its runner-up beside it (as many as the verifier takes)."""

    branches = True

    def branch(self, confidences, runner_up):
        return True


class NoisyDraft:
    """A model as a draft that is often wrong: its logits plus noise fixed by the position scored,
    so that the runner-up is often the verifier's choice and the kept path ends on a sibling."""

    def __init__(self, model: LlamaModel, scale: float):
        self.model, self.scale = model, scale

    def __getattr__(self, name):
        return getattr(self.model, name)

    def eval(self, tokens, *, n_logits):
        logits = self.model.eval(tokens, n_logits=n_logits)
        for row, position in zip(logits, range(self.model.n_past - n_logits, self.model.n_past)):
            row += np.random.default_rng(position).normal(scale=self.scale, size=row.shape).astype(row.dtype)
        return logits


def _chunks(tokens: list[int], size: int) -> list[list[int]]:
    return [tokens[start : start + size] for start in range(0, len(tokens), size)]


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


@pytest.mark.parametrize(
    "model_file, noise, k",
    [
        pytest.param("tiny_verifier", 0.0, 16, id="tiny-k16"),  # 16 drafts, 15 siblings: the most leaves
        pytest.param("smollm2", 3.0, 5, id="smollm2-k5", marks=pytest.mark.slow),  # a minute on 2 loaded cores
    ],
)
def test_greedy_tree_decoding_is_the_argmax_of_a_linear_evaluation(model_file, noise, k, request, tiny_draft):
    path_file = request.getfixturevalue(model_file)
    verifier = LlamaModel(path_file, n_ctx=256, n_threads=1)
    draft_file = tiny_draft if model_file == "tiny_verifier" else path_file
    draft = NoisyDraft(LlamaModel(draft_file, n_ctx=256, n_threads=1), noise)
    linear = LlamaModel(path_file, n_ctx=256, n_threads=1)
    n_siblings_taken = n_trees = 0
    for prompt in PROMPTS:
        prompt_tokens = verifier.tokenize(prompt, special=False)
        verifier.rewind(0)
        events = list(
            speculate(
                verifier=verifier,
                drafter=ModelDrafter(draft),
                prompt_tokens=prompt_tokens,
                k=AlwaysBranch(k),
                max_tokens=100,
                settings=GREEDY,
                rng=np.random.default_rng(0),
            )
        )
        output = [token for event in events for token in event.tokens]
        assert len(output) == 100
        # A linear evaluation scores every emitted token in its context, in batches of a size the
        # verify passes have (one of 64 tokens takes other kernels in llama.cpp, which round differently).
        linear.rewind(0)
        linear.eval(prompt_tokens[:-1], n_logits=0)
        answer = prompt_tokens[-1:] + output[:-1]
        rows = np.concatenate([linear.eval(chunk, n_logits=len(chunk)) for chunk in _chunks(answer, 16)])
        assert [int(np.argmax(row)) for row in rows] == output, prompt
        step_rows = np.concatenate([event.target_logits for event in events])
        np.testing.assert_allclose(step_rows, rows, atol=1e-3 * np.abs(rows).max(), err_msg=prompt)
        n_siblings_taken += sum(event.siblings_accepted for event in events)
        n_trees += sum(event.n_siblings > 0 for event in events)
    assert n_trees and n_siblings_taken  # paths that end on a sibling were kept


def test_a_rewind_to_the_caches_end_drops_a_pending_tree(tiny_verifier):
    model = LlamaModel(tiny_verifier, n_ctx=64, n_threads=1)
    linear = Linear(LlamaModel(tiny_verifier, n_ctx=64, n_threads=1))
    model.eval(CONTEXT[:-1], n_logits=0)
    model.eval_tree([80, 101, 201], [-1, 0, 0], n_logits=3)
    model.rewind(model.n_past)  # e.g. a step given up before anything was kept
    expected = linear(CONTEXT + [PROBE])
    np.testing.assert_allclose(model.eval([80, PROBE], n_logits=1)[0], expected, atol=1e-3 * np.abs(expected).max())
