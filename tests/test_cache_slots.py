"""Several cached conversations (--cache-slots): two clients alternating turns each re-read only
their new tokens from the second turn on, and answer exactly as with one cache."""

from __future__ import annotations

from live_server import live_server

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


K = 3  # speculating: the draft's cache is parked and restored too
TOPICS = {"A": "the cat and the dog", "B": "water in the sea"}


def _alternate(server, turns: int = 5, *, one_after_the_other: bool = False):
    """Clients A and B, turn by turn (or all of A's turns, then B's); per client, per turn:
    (prompt_tokens, cached, completion, answer)."""
    client = server.client()
    histories = {"A": [SYSTEM], "B": [SYSTEM]}
    seen: dict[str, list[tuple[int, int, int, str]]] = {"A": [], "B": []}
    order = [(name, turn) for turn in range(turns) for name in "AB"]
    if one_after_the_other:
        order.sort()
    for name, turn in order:
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
        seen = _alternate(slots)
    with live_server(*args, "--cache-slots", "1") as single:
        evicting = _alternate(single)
    with live_server(*args, "--cache-slots", "1") as fresh:  # fresh: reused prefixes may round differently
        alone = _alternate(fresh, one_after_the_other=True)
    for name in ("A", "B"):
        for (_, cached, _, _), (previous_prompt, _, previous_completion, answer) in zip(seen[name][1:], seen[name]):
            assert cached >= previous_prompt, seen[name]  # at least every earlier turn's prompt
            if "\ufffd" in answer:
                continue  # an answer that is not whole UTF-8 cannot be repeated as its tokens
            # All of the earlier turn is reused (the cache lacks at most the answer's newest token):
            # only the new message and its template are read.
            assert cached >= previous_prompt + previous_completion - 2, seen[name]
        # The answers each client gets talking alone: the restored caches are the very ones saved.
        assert [turn[3] for turn in seen[name]] == [turn[3] for turn in alone[name]]
    # With one cache, each client evicts the other: from the second turn on, all but the shared
    # system prompt is read again.
    assert all(cached < previous[0] for (_, cached, _, _), previous in zip(evicting["A"][1:], evicting["A"]))
