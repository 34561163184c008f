"""Several cached conversations (--cache-slots): two clients alternating turns each re-read from
the second turn on only what they re-read talking alone (their new tokens), and answer as they do alone."""

from __future__ import annotations

import numpy as np

from fakes import FakeModel, one_hot_logits
from live_server import live_server
from specgguf.core.engine import speculate
from specgguf.core.hot_vocab import HotVocab
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.serve.cache_slots import CacheSlots

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


K = 3  # speculating: the draft's cache is parked and restored too
TOPICS = {"A": "the cat and the dog", "B": "water in the sea"}


def _alternate(server, order: str = "ABABABABAB"):
    """Clients A and B taking turns in `order`; per client, per turn: (prompt_tokens, cached,
    completion, answer)."""
    client = server.client()
    histories = {"A": [SYSTEM], "B": [SYSTEM]}
    seen: dict[str, list[tuple[int, int, int, str]]] = {"A": [], "B": []}
    for index, name in enumerate(order):
        turn = order[:index].count(name)
        histories[name].append({"role": "user", "content": f"{TOPICS[name]} {turn}"})
        response = client.chat.completions.create(
            model="m", messages=histories[name], max_tokens=6, temperature=0, extra_body={"speculative": {"k": K}}
        )
        message, usage = response.choices[0].message, response.usage
        histories[name].append({"role": "assistant", "content": message.content})
        cached = usage.prompt_tokens_details.cached_tokens
        seen[name].append((usage.prompt_tokens, cached, usage.completion_tokens, message.content))
    return seen


def test_two_alternating_clients_reread_only_their_new_tokens(tiny_verifier, tiny_draft):
    args = ("-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "-t", "1", "--parallel", "1")
    with live_server(*args, "--cache-slots", "2") as slots:
        # A client also asks twice in a row: a follow-up of the live conversation parks nothing, even
        # where the earlier answer's generated tokens are not what its text tokenizes to.
        seen = _alternate(slots, "ABBAABBAAB")
    with live_server(*args, "--cache-slots", "1") as single:
        evicting = _alternate(single)
    with live_server(*args, "--cache-slots", "1") as fresh:  # fresh: reused prefixes may round differently
        alone = _alternate(fresh, "AAAAABBBBB")
    for name in ("A", "B"):
        for (_, cached, _, _), (previous_prompt, _, _, _) in zip(seen[name][1:], seen[name]):
            assert cached >= previous_prompt, seen[name]  # at least every earlier turn's prompt
        # Each client reads what it reads talking alone (all of its earlier turns, but where an answer's
        # generated tokens are not what its text tokenizes to) and gets the same answers: the restored
        # caches are the very ones saved.
        assert seen[name] == alone[name]
    # With one cache, each client evicts the other: from the second turn on, all but the shared
    # system prompt is read again.
    assert all(cached < previous[0] for (_, cached, _, _), previous in zip(evicting["A"][1:], evicting["A"]))


def test_two_alternating_clients_keep_a_live_sequence_each(tiny_verifier, tiny_draft):
    """--parallel 2: the live sequences are the cached conversations; each client takes the one that
    holds its conversation, and reads what it reads talking alone, with the same answers."""
    args = ("-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "-t", "1")
    with live_server(*args, "--parallel", "2") as lanes:
        seen = _alternate(lanes, "ABBAABBAAB")
    with live_server(*args, "--parallel", "2") as fresh:
        alone = _alternate(fresh, "AAAAABBBBB")
    for name in ("A", "B"):
        for (_, cached, _, _), (previous_prompt, _, _, _) in zip(seen[name][1:], seen[name]):
            assert cached >= previous_prompt, seen[name]
        assert seen[name] == alone[name]


# --- a hot-vocabulary draft parked and restored (in process, fakes) ------------------------------

HOT_IDS = np.arange(8)  # the draft scores tokens 0..7; 8 and 9 are read as 0
HOT_FEED = np.array([0, 1, 2, 3, 4, 5, 6, 7, 0, 0])
GREEDY = SamplingSettings(temperature=0.0)


def _counting(context):
    return context[-1] % 9 + 1  # 1, 2, ..., 9, 1, ...: 8 and 9 are outside the hot set


def _answer(verifier, draft, prompt, n=8):
    events = speculate(
        verifier=verifier,
        drafter=ModelDrafter(draft),
        prompt_tokens=prompt,
        k=3,
        max_tokens=n,
        settings=GREEDY,
        rng=np.random.default_rng(0),
    )
    return [token for event in events for token in event.tokens]


def test_a_hot_vocabulary_draft_restored_from_a_slot_holds_the_very_tokens_it_had():
    verifier = FakeModel(one_hot_logits(_counting, 10), n_vocab=10)
    inner = FakeModel(lambda context: one_hot_logits(_counting, 10)(context)[HOT_IDS], n_vocab=8)
    draft = HotVocab(inner, HOT_IDS, HOT_FEED)
    slots = CacheSlots([verifier, draft], n_slots=2)
    first = [5, 6, 7]
    slots.select(first)
    answer = _answer(verifier, draft, first)
    held = list(draft.cached)
    assert held and 8 in held  # a cold token in the draft's cache
    other = [2, 1, 2]
    slots.select(other)  # another conversation: the first is parked
    _answer(verifier, draft, other)
    follow_up = [*first, *answer, 4]
    slots.select(follow_up)  # the first is restored, the draft's cache with it
    assert slots.n_swaps == 1
    assert draft.cached == held and inner.cached == HOT_FEED[held].tolist()
    n_calls = len(inner.eval_calls)
    expected = [*follow_up]
    for _ in range(8):
        expected.append(_counting(expected))
    assert _answer(verifier, draft, follow_up) == expected[len(follow_up) :]  # the verifier's argmax
    # It read only what its restored cache lacked: a catch-up over the prompt's rest and the first token
    # (the prompt pass's), then its first draft's row.
    assert inner.eval_calls[n_calls] == HOT_FEED[follow_up[len(held) :]].tolist()
    assert inner.eval_calls[n_calls + 1] == HOT_FEED[expected[len(follow_up) : len(follow_up) + 1]].tolist()
