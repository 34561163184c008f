"""Several cached conversations (--cache-slots): two clients alternating turns each re-read from
the second turn on only what they re-read talking alone (their new tokens), and answer as they do alone."""

from __future__ import annotations

from live_server import live_server

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
    args = ("-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "-t", "1")
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
