"""The property docs/serve.md states for `serve --deterministic`, on the default pair with the real `openai`
client: the same greedy request gets the same tokens alone, again, and beside two other clients (theirs
deterministic too, or sharing passes with each other: `"speculative": {"deterministic": false}`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from live_server import live_server

pytestmark = pytest.mark.slow

QUESTION = "Write a Python function that merges two sorted lists, with a docstring."
OTHERS = ["Explain what a Python generator is, briefly.", "List five prime numbers and say why each is prime."]
N_TOKENS = 48


@pytest.fixture(scope="module")
def server(qwen_pair):
    verifier, draft = qwen_pair
    args = ("-m", verifier, "-md", draft, "-c", "1024", "--parallel", "3", "--deterministic")
    with live_server(*args, startup_timeout=240) as live:
        yield live


def _answer(client, content: str, **speculative) -> tuple[list[str], str]:
    """The answer's tokens (as the log-probabilities name them) and its finish reason."""
    response = client.chat.completions.create(
        model="coder",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=N_TOKENS,
        logprobs=True,
        extra_body={"speculative": speculative} if speculative else None,
    )
    choice = response.choices[0]
    return [entry.token for entry in choice.logprobs.content], choice.finish_reason


def _beside_others(client, **others) -> tuple[list[str], str]:
    """The question's answer while two other clients ask theirs (started together)."""
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_answer, client, content, **others) for content in OTHERS]
        mine = pool.submit(_answer, client, QUESTION)
        for future in futures:
            assert future.result(timeout=600)[0]
        return mine.result(timeout=600)


def test_the_same_greedy_request_gets_the_same_tokens_whatever_else_runs(server):
    client = server.client(timeout=600)
    alone = _answer(client, QUESTION)
    assert len(alone[0]) == N_TOKENS
    assert _answer(client, QUESTION) == alone  # again: its prompt read whole, not its cache's last token
    assert _beside_others(client) == alone
    assert _beside_others(client, deterministic=False) == alone  # the two others sharing passes
