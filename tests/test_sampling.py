"""The acceptance rule and the processed distributions, on small vocabularies.

The statistical tests use fixed seeds, so they are deterministic; their
thresholds are loose enough that a correct rule passes for any seed
(p > 1e-4) and tight enough that the known-wrong rule fails by far (p < 1e-12).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from specgguf.core.sampling import (
    TOP_K_WINDOWS,
    SamplingSettings,
    accept_drafts,
    accept_greedy,
    accept_tree,
    accept_tree_greedy,
    children_of,
    process_logits,
    sample_token,
    sparse_distribution,
    top_k_indices,
)

N_DRAWS = 100_000
VOCAB = 6


def _wrong_accept(*, target_probs, draft_probs, draft_tokens, rng):
    """The rule some write-ups state, u < (p - q) / p. Not lossless; kept to prove the test bites."""
    for position, token in enumerate(draft_tokens):
        target_at, draft_at = target_probs[position, token], draft_probs[position, token]
        accepted = target_at > 0 and rng.random() < (target_at - draft_at) / target_at
        if not accepted:
            residual = np.maximum(target_probs[position] - draft_probs[position], 0)
            return position, sample_token(residual if residual.sum() > 0 else target_probs[position], rng)
    return len(draft_tokens), sample_token(target_probs[len(draft_tokens)], rng)


def _random_pair(rng, k, *, closeness):
    """Target rows (k+1, V) and draft rows (k, V), some entries exactly zero."""
    target = rng.dirichlet(np.full(VOCAB, 0.8), size=k + 1)
    target[:, 0] = 0.0  # a token the target never emits
    target /= target.sum(axis=1, keepdims=True)
    other = rng.dirichlet(np.full(VOCAB, 0.8), size=k)
    other[:, 1] = 0.0  # a token the draft never proposes
    other /= other.sum(axis=1, keepdims=True)
    draft = closeness * target[:k] + (1 - closeness) * other
    return target, draft / draft.sum(axis=1, keepdims=True)


def _emitted_counts(accept, target, draft, rng):
    """counts[position, token] of tokens emitted at each position of one step."""
    k = draft.shape[0]
    # Draw every draft token up front by inverse CDF (drafting is not under test).
    cdf = np.cumsum(draft, axis=1)
    drafts = (rng.random((N_DRAWS, k, 1)) * cdf[:, -1:] >= cdf[None]).sum(axis=2)
    outcomes = np.array(
        [accept(target_probs=target, draft_probs=draft, draft_tokens=tokens, rng=rng) for tokens in drafts]
    )
    n_accepted, next_tokens = outcomes[:, 0], outcomes[:, 1]
    # Tallied once, after the draws: each accepted draft at its position, then the next token at n_accepted.
    counts = np.zeros((k + 1, VOCAB), dtype=np.int64)
    accepted = np.arange(k)[None, :] < n_accepted[:, None]  # (draw, position): accepted there
    np.add.at(counts, (np.nonzero(accepted)[1], drafts[accepted]), 1)
    np.add.at(counts, (n_accepted, next_tokens), 1)
    return counts


def _position_p_values(counts, target):
    """Chi-square p-value per position: are the tokens emitted there target-distributed?"""
    p_values = []
    for position, row in enumerate(counts):
        if row.sum() < 200:
            continue
        support = target[position] > 0
        assert row[~support].sum() == 0, "emitted a token the target gives zero probability"
        expected = target[position][support] * row.sum()
        p_values.append(chisquare(row[support], expected).pvalue)
    return p_values


@pytest.mark.parametrize("k, closeness, seed", [(1, 0.3, 11), (2, 0.5, 12), (4, 0.6, 13), (8, 0.8, 14)])
def test_emitted_tokens_follow_the_target_distribution(k, closeness, seed):
    rng = np.random.default_rng(seed)
    target, draft = _random_pair(rng, k, closeness=closeness)
    p_values = _position_p_values(_emitted_counts(accept_drafts, target, draft, rng), target)
    assert len(p_values) >= min(k + 1, 3)
    assert min(p_values) > 1e-4, p_values


@pytest.mark.parametrize("k, seed", [(1, 21), (4, 22)])
def test_the_wrong_rule_fails_the_same_check(k, seed):
    rng = np.random.default_rng(seed)
    target, draft = _random_pair(rng, k, closeness=0.3)
    p_values = _position_p_values(_emitted_counts(_wrong_accept, target, draft, rng), target)
    assert min(p_values) < 1e-12, p_values


def test_equal_distributions_accept_everything():
    rng = np.random.default_rng(3)
    target = rng.dirichlet(np.ones(VOCAB), size=5)
    for _ in range(2000):
        drafts = np.array([sample_token(row, rng) for row in target[:4]])
        n_accepted, _ = accept_drafts(target_probs=target, draft_probs=target[:4], draft_tokens=drafts, rng=rng)
        assert n_accepted == 4


def test_zero_target_probability_always_rejects_and_replacement_avoids_the_draft_token():
    rng = np.random.default_rng(4)
    target = np.array([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    draft = np.array([[1.0, 0.0, 0.0]])
    for _ in range(500):
        n_accepted, next_token = accept_drafts(
            target_probs=target, draft_probs=draft, draft_tokens=np.array([0]), rng=rng
        )
        assert n_accepted == 0 and next_token in (1, 2)


def test_greedy_accepts_exactly_while_drafts_equal_the_argmax():
    target_logits = np.array(
        [
            [0.0, 5.0, 1.0],  # argmax 1
            [3.0, 0.0, 1.0],  # argmax 0
            [0.0, 1.0, 2.0],  # argmax 2
            [9.0, 0.0, 0.0],  # bonus row, argmax 0
        ]
    )
    assert accept_greedy(target_logits=target_logits, draft_tokens=[1, 0, 2]) == (3, 0)
    assert accept_greedy(target_logits=target_logits, draft_tokens=[1, 0, 1]) == (2, 2)
    assert accept_greedy(target_logits=target_logits, draft_tokens=[2, 0, 2]) == (0, 1)
    assert accept_greedy(target_logits=target_logits[:1], draft_tokens=[]) == (0, 1)


def _probs_of(probabilities, settings):
    return process_logits(np.log(np.array(probabilities)), settings)[0]


def test_top_k_keeps_the_k_largest():
    probs = process_logits(
        np.array([1.0, 3.0, 2.0, 0.0]), SamplingSettings(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    )[0]
    expected = np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum()
    np.testing.assert_allclose(probs, [0.0, expected[0], expected[1], 0.0])


def test_top_p_keeps_the_token_that_crosses_p_and_ignores_temperature():
    base = [0.5, 0.3, 0.15, 0.05]
    for temperature in (0.5, 1.0, 2.0):
        settings = SamplingSettings(temperature=temperature, top_k=0, top_p=0.75, min_p=0.0)
        assert np.count_nonzero(_probs_of(base, settings)) == 2
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=0.85, min_p=0.0)
    np.testing.assert_allclose(_probs_of(base, settings), np.array([0.5, 0.3, 0.15, 0]) / 0.95)


def test_min_p_is_relative_to_the_top_token_before_temperature():
    settings = SamplingSettings(temperature=3.0, top_k=0, top_p=1.0, min_p=0.2)
    probs = _probs_of([0.5, 0.3, 0.15, 0.05], settings)
    assert np.count_nonzero(probs) == 3  # 0.05 < 0.2 * 0.5
    tempered = np.log([0.5, 0.3, 0.15]) / 3.0
    np.testing.assert_allclose(probs[:3], np.exp(tempered) / np.exp(tempered).sum())


def test_masked_logits_never_get_probability():
    probs = process_logits(
        np.array([1.0, -np.inf, 0.5]), SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    )[0]
    assert probs[1] == 0.0 and probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2.0)]
)
def test_settings_reject_out_of_range_values(bad):
    with pytest.raises(ValueError):
        SamplingSettings(**bad)


# --- draft trees: several candidates per position ---
TREE_DRAWS = 60_000


def _wrong_tree_rule(*, target_probs, draft_probs, draft_tokens, parents, rng):
    """Each sibling tested against the verifier's unchanged distribution (no residual between
    siblings), the residual only at the end. Not lossless; kept to prove the tree test bites."""
    children = children_of(parents)
    path, node = [], -1
    while True:
        p = target_probs(node)
        for child in children.get(node, []):
            x, q = draft_tokens[child], draft_probs[child]
            if rng.random() * q[x] < p[x]:
                path.append(child)
                node = child
                break
        else:
            last = children.get(node)
            residual = np.maximum(p - draft_probs[last[-1]], 0.0) if last else p
            return path, sample_token(residual if residual.sum() > 0 else p, rng)


def _tree_counts(accept, rng, *, n_root, n_below):
    """counts[first, second] of the first two emitted tokens over TREE_DRAWS trees: `n_root`
    independent draws below the root, `n_below` below the first copy of each drawn token."""
    target_root, draft_root = _random_pair(rng, 0, closeness=0.3)[0][0], rng.dirichlet(np.ones(VOCAB))
    target_next = rng.dirichlet(np.full(VOCAB, 0.8), size=VOCAB)
    draft_next = rng.dirichlet(np.full(VOCAB, 0.8), size=VOCAB)
    counts = np.zeros((VOCAB, VOCAB), dtype=np.int64)
    for _ in range(TREE_DRAWS):
        tokens, parents, probs = [], [], []
        roots = [sample_token(draft_root, rng) for _ in range(n_root)]
        for token in roots:
            tokens.append(token), parents.append(-1), probs.append(draft_root)
        for node, token in enumerate(roots):
            if token in roots[:node]:
                continue  # a repeat: never accepted, so nothing below it
            for _ in range(n_below):
                tokens.append(sample_token(draft_next[token], rng)), parents.append(node)
                probs.append(draft_next[token])

        def target(node, tokens=tokens):
            return target_root if node < 0 else target_next[tokens[node]]

        path, next_token = accept(target_probs=target, draft_probs=probs, draft_tokens=tokens, parents=parents, rng=rng)
        emitted = [tokens[node] for node in path] + [next_token]
        if len(emitted) < 2:  # nothing accepted: the second token is the verifier's own next one
            emitted.append(sample_token(target_next[emitted[0]], rng))
        counts[emitted[0], emitted[1]] += 1
    return counts, np.outer(target_root, np.ones(VOCAB)) * target_next


@pytest.mark.parametrize("n_root, n_below, seed", [(2, 1, 31), (3, 2, 32), (4, 0, 33)])
def test_tree_rule_emits_the_target_distribution(n_root, n_below, seed):
    counts, expected = _tree_counts(accept_tree, np.random.default_rng(seed), n_root=n_root, n_below=n_below)
    support = expected > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], expected[support] * TREE_DRAWS).pvalue > 1e-4


def test_the_tree_rule_without_residuals_between_siblings_fails_the_same_check():
    counts, expected = _tree_counts(_wrong_tree_rule, np.random.default_rng(34), n_root=3, n_below=1)
    support = expected > 0
    assert chisquare(counts[support], expected[support] * TREE_DRAWS).pvalue < 1e-12


def test_a_chain_is_a_tree_with_one_child_per_node():
    rng_chain, rng_tree = np.random.default_rng(8), np.random.default_rng(8)
    target, draft = _random_pair(np.random.default_rng(9), 3, closeness=0.5)
    tokens = np.array([2, 3, 4])
    n_accepted, next_token = accept_drafts(target_probs=target, draft_probs=draft, draft_tokens=tokens, rng=rng_chain)
    path, tree_next = accept_tree(
        target_probs=lambda node: target[node + 1],
        draft_probs=list(draft),
        draft_tokens=list(tokens),
        parents=[-1, 0, 1],
        rng=rng_tree,
    )
    assert (len(path), tree_next) == (n_accepted, next_token)


def test_greedy_tree_follows_the_verifiers_argmax_through_siblings():
    # pending -> {5 -> 7, 6 -> {8, 9}}; the verifier wants 6, then 9, then 1.
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, 0, 1, 1]
    wanted = {-1: 6, 1: 9, 4: 1, 0: 7, 2: 0, 3: 0}
    assert accept_tree_greedy(target_argmax=wanted.__getitem__, draft_tokens=tokens, parents=parents) == ([1, 4], 1)
    wanted[-1] = 3  # nothing drafted matches: the verifier's own token
    assert accept_tree_greedy(target_argmax=wanted.__getitem__, draft_tokens=tokens, parents=parents) == ([], 3)


def test_masked_entries_are_set_aside_before_top_k_and_never_survive():
    """A row with most entries −inf (a grammar's mask, a hot-vocabulary draft) gives the distribution
    of its finite entries alone, mapped back to their ids."""
    rng = np.random.default_rng(3)
    settings = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    row = np.full(5000, -np.inf)
    kept = np.sort(rng.choice(5000, size=300, replace=False))
    row[kept] = rng.normal(size=300) * 3
    tokens, probs = sparse_distribution(row, settings)
    sub_tokens, sub_probs = sparse_distribution(row[kept], settings)
    assert tokens.tolist() == kept[sub_tokens].tolist()
    np.testing.assert_allclose(probs, sub_probs)
    few = np.full(5000, -np.inf)
    few[[7, 4000]] = [1.0, 2.0]  # fewer finite entries than top_k: all of them
    tokens, probs = sparse_distribution(few, SamplingSettings(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0))
    assert tokens.tolist() == [4000, 7] and np.isclose(probs.sum(), 1.0)


@pytest.mark.parametrize("scale", [0.5, 4.0, 9.0, 20.0])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_top_k_indices_are_the_k_largest_whether_or_not_the_window_holds_them(scale, k):
    """The windows (values within TOP_K_WINDOWS of the largest) are only a shortcut: with many values
    near the top (scale 0.5), some (4), fewer than k in the first window (9) or in every window (20),
    the k largest come out, ties included."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        values = np.round(rng.standard_normal(3000) * scale, 1).astype(np.float32)  # rounding makes ties
        chosen = top_k_indices(values, k)
        assert len(set(chosen.tolist())) == k
        np.testing.assert_array_equal(np.sort(values[chosen]), np.sort(values)[-k:])


def test_plain_steps_draw_from_the_processed_distribution():
    """A step without drafts draws from p's support (not the whole vocabulary): the first token's
    law, over a vocabulary whose logits spread wide enough for top-k's window, is process_logits'."""
    from scipy.stats import chisquare

    from fakes import FakeModel
    from specgguf.core.engine import speculate

    vocab = 300
    logits = np.random.default_rng(3).standard_normal(vocab) * 3.0
    settings = SamplingSettings(temperature=1.3, top_k=12, top_p=0.97, min_p=0.02)
    expected = process_logits(logits, settings)[0]
    assert np.count_nonzero(logits >= logits.max() - TOP_K_WINDOWS[0]) < vocab  # the window's path is taken
    rng, counts = np.random.default_rng(11), np.zeros(vocab)
    for _ in range(6000):
        verifier = FakeModel(lambda _context: logits, n_vocab=vocab)
        (event,) = speculate(verifier=verifier, prompt_tokens=[0], k=0, max_tokens=1, settings=settings, rng=rng)
        counts[event.tokens[0]] += 1
    support = expected > 0
    assert 4 <= support.sum() < 12  # top-k and another cut both bite
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], expected[support] * counts.sum()).pvalue > 1e-4
