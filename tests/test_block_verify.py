"""Block verification (core/block_verify.py): its output law is the verifier's, exactly by enumeration
on small tables and through `core.engine.speculate` with chi-square tests (test_laws.py's harness, at
temperatures 0.5, 1.0 and 1.5 with top-k, top-p and min-p all cutting); it keeps at least as many
drafts on average as the token rule; greedy decoding is the same under both rules; and planted wrong
variants fail the same checks the real rule passes.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

import specgguf.core.block_verify
from fakes import FakeModel
from specgguf.core import block_verify
from specgguf.core.block_verify import accept_block, block_weights
from specgguf.core.engine import FixedK, speculate
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings, accept_greedy, sample_token
from test_laws import DRAFT, LENGTH, PROMPT, SOURCES, TARGET, VOCAB, _law, _p_value, _path, _settings, _tally

# --- the exact law, by enumeration ----------------------------------------------------------

N_DRAFTS = 3
SMALL_VOCAB = 4


def _markov(seed, *, cut=True):
    """Next-token distributions given the previous token (rows indexed by it), with one token of each
    row cut to zero, as top-k and min-p cut them."""
    rng = np.random.default_rng(seed)
    rows = rng.dirichlet(np.ones(SMALL_VOCAB), size=SMALL_VOCAB)
    if cut:
        rows[np.arange(SMALL_VOCAB), rng.integers(SMALL_VOCAB, size=SMALL_VOCAB)] = 0.0
    return rows / rows.sum(axis=1, keepdims=True)


def _rows(table, prefix, n):
    """The rows after each of the first n prefixes of `prefix` (token 0 stands before the block)."""
    return np.array([table[([0, *prefix])[i]] for i in range(n)])


def _sequence_probability(table, tokens, start=0):
    previous, probability = start, 1.0
    for token in tokens:
        probability *= table[previous][token]
        previous = token
    return probability


def _step_law(target, draft, weights=block_weights):
    """The exact law of the first N_DRAFTS + 1 tokens when one step of block verification (with
    `weights` for its deterministic half) is followed by plain decoding from `target`."""
    law = np.zeros((SMALL_VOCAB,) * (N_DRAFTS + 1))
    for drafts in itertools.product(range(SMALL_VOCAB), repeat=N_DRAFTS):
        drafted = _sequence_probability(draft, drafts)
        if drafted == 0.0:
            continue
        target_rows = _rows(target, drafts, N_DRAFTS + 1)
        stops, residuals = weights(
            target_probs=target_rows, draft_probs=_rows(draft, drafts, N_DRAFTS), draft_tokens=drafts
        )
        for n_kept in range(N_DRAFTS + 1):
            chance = (1.0 if n_kept == 0 else stops[n_kept - 1]) * np.prod(1.0 - stops[n_kept:])
            if n_kept == N_DRAFTS:
                next_probs = target_rows[N_DRAFTS]
            else:
                residual = residuals[n_kept]
                next_probs = residual / residual.sum() if residual.sum() > 0 else target_rows[n_kept]
            for token in np.flatnonzero(next_probs):
                prefix = [*drafts[:n_kept], int(token)]
                for rest in itertools.product(range(SMALL_VOCAB), repeat=N_DRAFTS - n_kept):
                    tail = _sequence_probability(target, rest, start=prefix[-1])
                    law[tuple(prefix) + tuple(rest)] += drafted * chance * next_probs[token] * tail
    return law


def _target_law(target):
    law = np.zeros((SMALL_VOCAB,) * (N_DRAFTS + 1))
    for tokens in itertools.product(range(SMALL_VOCAB), repeat=N_DRAFTS + 1):
        law[tokens] = _sequence_probability(target, tokens)
    return law


def _pairs():
    """(target, draft) tables: random ones, a draft equal to the target on one row (stop weights of
    0/0), and a deterministic draft (one-hot rows: prompt lookup)."""
    for seed in range(6):
        yield pytest.param(_markov(seed), _markov(100 + seed), id=f"random-{seed}")
    target, draft = _markov(7), _markov(8)
    draft[2] = target[2]
    yield pytest.param(target, draft, id="equal-row")
    yield pytest.param(_markov(9), np.eye(SMALL_VOCAB)[[1, 2, 3, 0]], id="one-hot")


@pytest.mark.parametrize("target, draft", list(_pairs()))
def test_one_step_then_plain_decoding_has_the_verifiers_law_exactly(target, draft):
    assert np.abs(_step_law(target, draft) - _target_law(target)).max() < 1e-12


def test_one_draft_is_the_token_rule():
    """With K = 1 the stop weight is min(1, p(x) / q(x)) and the residual the token rule's."""
    target_rows, draft_rows = _markov(3)[:2], _markov(4)[:1]
    for token in np.flatnonzero(draft_rows[0]):
        stops, residuals = block_weights(target_probs=target_rows, draft_probs=draft_rows, draft_tokens=[token])
        assert stops[0] == pytest.approx(min(1.0, target_rows[0][token] / draft_rows[0][token]))
        np.testing.assert_allclose(residuals[0], np.maximum(target_rows[0] - draft_rows[0], 0.0))


# Planted wrong variants: each a plausible mistake, each must miss the law the real rule meets.


def _weights_capped_per_position(*, target_probs, draft_probs, draft_tokens):
    """Each ratio capped at 1 on its own (the token rule's per-position chance), no running product."""
    stops, residuals = block_weights(target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens)
    for i, token in enumerate(draft_tokens):
        weight = min(1.0, target_probs[i][token] / draft_probs[i][token])
        if i < len(draft_tokens) - 1:
            residual = np.maximum(weight * target_probs[i + 1] - draft_probs[i + 1], 0.0)
            mass = residual.sum()
            stops[i] = mass / (mass + 1.0 - weight) if mass + 1.0 - weight > 0 else 0.0
            residuals[i + 1] = residual
        else:
            stops[i] = weight
    return stops, residuals


def _residuals_unweighted(*, target_probs, draft_probs, draft_tokens):
    """The residual after a kept prefix drawn from max(0, p - q), the prefix's weight left out."""
    stops, residuals = block_weights(target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens)
    return stops, [np.maximum(target_probs[i] - draft_probs[i], 0.0) for i in range(len(residuals))]


PLANTS = [_weights_capped_per_position, _residuals_unweighted]


@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_wrong_variant_misses_the_law(plant):
    target, draft = _markov(0), _markov(100)
    assert np.abs(_step_law(target, draft, plant) - _target_law(target)).max() > 1e-3


# --- never fewer drafts kept than the token rule ---------------------------------------------


def _expected_kept(target, draft):
    """(block verification's, the token rule's) expected number of drafts kept in one step, exactly."""
    block = token = 0.0
    for drafts in itertools.product(range(SMALL_VOCAB), repeat=N_DRAFTS):
        drafted = _sequence_probability(draft, drafts)
        if drafted == 0.0:
            continue
        target_rows, draft_rows = _rows(target, drafts, N_DRAFTS + 1), _rows(draft, drafts, N_DRAFTS)
        stops, _ = block_weights(target_probs=target_rows, draft_probs=draft_rows, draft_tokens=drafts)
        chances = [stops[n - 1] * np.prod(1.0 - stops[n:]) for n in range(1, N_DRAFTS + 1)]
        block += drafted * sum(n * chance for n, chance in enumerate(chances, start=1))
        ratios = [min(1.0, target_rows[i][x] / draft_rows[i][x]) for i, x in enumerate(drafts)]
        token += drafted * sum(np.prod(ratios[:n]) for n in range(1, N_DRAFTS + 1))  # sum of P(kept >= n)
    return block, token


def test_block_verification_keeps_at_least_as_many_drafts_as_the_token_rule():
    gains = []
    for seed in range(40):
        block, token = _expected_kept(_markov(200 + seed, cut=seed % 2 == 0), _markov(300 + seed))
        assert block >= token - 1e-12
        gains.append(block - token)
    assert max(gains) > 0.01  # and strictly more on some tables


def test_the_drawn_number_kept_matches_the_exact_expectation():
    """accept_block's draws (its random half) average to the enumeration's expectation."""
    target, draft = _markov(11), _markov(12)
    rng = np.random.default_rng(5)
    kept = []
    for _ in range(20_000):
        drafts, previous = [], 0
        for _ in range(N_DRAFTS):
            drafts.append(int(rng.choice(SMALL_VOCAB, p=draft[previous])))
            previous = drafts[-1]
        n_kept, _ = accept_block(
            target_probs=_rows(target, drafts, N_DRAFTS + 1),
            draft_probs=_rows(draft, drafts, N_DRAFTS),
            draft_tokens=drafts,
            rng=rng,
        )
        kept.append(n_kept)
    expected, _ = _expected_kept(target, draft)
    assert abs(np.mean(kept) - expected) < 4 * np.std(kept) / np.sqrt(len(kept))


# --- through the engine --------------------------------------------------------------------

BLOCK_TEMPERATURES = [0.5, 1.0, 1.5]
BLOCK_PATHS = ["model", "hybrid", "tree"]  # trees keep the tree rule under acceptance="block"


def _block_settings(temperature):
    return replace(_settings(temperature), acceptance="block")


def _engine_p_value(kind, settings, *, seed, n_sequences, length=LENGTH):
    drafter, policy = _path(kind)
    tally = _tally(drafter, policy, settings, length=length, seed=seed, n_sequences=n_sequences)
    assert tally.sources == SOURCES[kind]
    return _p_value(tally.counts, _law(settings, length))


# A planted rule is checked on answers one token longer: more of their steps draft (the first token is
# the prompt pass's), and a wrong tau shows in their law (4,000 answers of 4 tokens: p 0.01-0.08).
PLANTED_LENGTH = LENGTH + 1


@pytest.mark.slow
@pytest.mark.parametrize("temperature", BLOCK_TEMPERATURES)
@pytest.mark.parametrize("kind", BLOCK_PATHS)
def test_sampled_sequences_follow_the_verifiers_processed_law(kind, temperature):
    assert _engine_p_value(kind, _block_settings(temperature), seed=41, n_sequences=20_000) > 1e-4


def _decided_from_the_start(*, target_probs, draft_probs, draft_tokens, rng):
    """`accept_block` with tau decided as the token rule decides it: at the first u_i >= stop_i."""
    stops, residuals = block_weights(target_probs=target_probs, draft_probs=draft_probs, draft_tokens=draft_tokens)
    n_drafts = len(draft_tokens)
    refused = np.flatnonzero(rng.random(n_drafts) >= stops)
    n_kept = int(refused[0]) if refused.size else n_drafts
    if n_kept == n_drafts:
        return n_kept, sample_token(target_probs[n_drafts], rng)
    residual = residuals[n_kept]
    return n_kept, sample_token(residual if residual.sum() > 0 else target_probs[n_kept], rng)


# Through the engine the draft model's chain is the path to plant on: the hybrid's n-gram drafts are
# one-hot rows and mostly short, where a wrong residual's weight or tau's direction changes nothing.


def test_deciding_tau_from_the_start_fails_the_check(monkeypatch):
    monkeypatch.setattr(specgguf.core.engine, "accept_block", _decided_from_the_start)
    assert _engine_p_value("model", _block_settings(0.5), seed=42, n_sequences=4000, length=PLANTED_LENGTH) < 1e-12


def test_weights_capped_per_position_emit_what_the_verifier_never_does(monkeypatch):
    monkeypatch.setattr(specgguf.core.block_verify, "block_weights", _weights_capped_per_position)
    with pytest.raises(AssertionError, match="never does"):
        _engine_p_value("model", _block_settings(0.5), seed=42, n_sequences=4000)


def test_the_engine_uses_block_verification_on_chains_only_when_asked(monkeypatch):
    calls = []
    real = block_verify.accept_block

    def counted(**arguments):
        calls.append(len(arguments["draft_tokens"]))
        return real(**arguments)

    monkeypatch.setattr(specgguf.core.engine, "accept_block", counted)
    for acceptance in ("token", "block"):
        settings = replace(_settings(1.0), acceptance=acceptance)
        _tally(ModelDrafter(_draft_model()), FixedK(3), settings, length=6, seed=1, n_sequences=5)
        assert bool(calls) == (acceptance == "block")
    assert set(calls) <= {1, 2, 3} and 3 in calls


def _draft_model():
    return FakeModel(lambda context: DRAFT[context[-1]], n_vocab=VOCAB)


def test_greedy_decoding_is_the_same_under_both_rules():
    verifier = FakeModel(lambda context: TARGET[context[-1]], n_vocab=VOCAB)
    answers = []
    for acceptance in ("token", "block"):
        settings = SamplingSettings(temperature=0.0, acceptance=acceptance)
        events = speculate(
            verifier=verifier,
            drafter=ModelDrafter(_draft_model()),
            prompt_tokens=PROMPT,
            k=3,
            max_tokens=40,
            settings=settings,
            rng=np.random.default_rng(0),
        )
        answers.append([(event.tokens, event.n_accepted) for event in events])
    assert answers[0] == answers[1]
    assert sum(len(tokens) for tokens, _ in answers[0]) == 40


def test_one_hot_rows_are_the_greedy_rule():
    """Temperature 0's limit: one-hot verifier rows (its argmax) and one-hot drafts. Block verification
    keeps exactly the drafts the greedy rule keeps, and draws the verifier's argmax after them."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        argmaxes = rng.integers(SMALL_VOCAB, size=N_DRAFTS + 1)
        drafts = np.where(rng.random(N_DRAFTS) < 0.7, argmaxes[:N_DRAFTS], rng.integers(SMALL_VOCAB, size=N_DRAFTS))
        target_rows, draft_rows = np.eye(SMALL_VOCAB)[argmaxes], np.eye(SMALL_VOCAB)[drafts]
        greedy = accept_greedy(target_logits=np.log(target_rows + 1e-9), draft_tokens=drafts)
        block = accept_block(target_probs=target_rows, draft_probs=draft_rows, draft_tokens=drafts, rng=rng)
        assert block == greedy


def test_an_unknown_acceptance_rule_is_refused():
    with pytest.raises(ValueError, match="acceptance"):
        SamplingSettings(acceptance="tree")


def test_no_drafts_draw_from_the_first_row():
    """K = 0 (a step with nothing drafted): the next token is the verifier's own draw."""
    target_rows = np.array([[0.0, 1.0, 0.0, 0.0]])
    n_kept, token = accept_block(
        target_probs=target_rows, draft_probs=np.zeros((0, 4)), draft_tokens=[], rng=np.random.default_rng(0)
    )
    assert (n_kept, token) == (0, 1)


# --- the command line ------------------------------------------------------------------------


def test_run_accept_block_reaches_the_settings(cli, tiny_verifier, tiny_draft):
    pair = ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256", "-k", "3", "-n", "12", "--seed", "2", "--json"]
    result = cli("run", *pair, "--temp", "1.0", "--accept", "block", "the cat")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["acceptance"] == "block" and report["n_tokens"] == 12
    default = json.loads(cli("run", *pair, "the cat").stdout)
    assert default["settings"]["acceptance"] == "token"  # off unless asked


def test_run_refuses_an_unknown_acceptance_rule(cli, tiny_verifier, tiny_draft):
    result = cli("run", "-m", tiny_verifier, "-md", tiny_draft, "--accept", "tree", "the cat")
    assert result.returncode != 0 and "--accept must be token or block" in result.stderr


def test_a_server_request_keeps_the_servers_acceptance_rule():
    from specgguf.serve.common import sampling_from

    request = sampling_from(SamplingSettings(acceptance="block"), temperature=1.2, top_k=10)
    assert request.acceptance == "block" and request.temperature == 1.2 and request.top_k == 10
