"""What a served prompt reads: its request's whole text tokenized fresh, whatever the server served
before. A follow-up that continues an earlier request's text gets the prompt tokens and the greedy
answer that `specgguf run --raw` (a fresh start) gets for that text, as llama-server would, never
the earlier tokens with the new text's tokens spliced on."""

from __future__ import annotations

import json

import jinja2
import pytest

from live_server import live_server
from specgguf.llama.vocab import read_vocab
from tiny_gguf import DEFAULT_TEMPLATE

GREEDY = {"temperature": 0, "extra_body": {"speculative": {"k": 3}}}


@pytest.fixture(scope="module")
def tiny_args(tiny_verifier, tiny_draft):
    return ("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1")


@pytest.fixture(scope="module")
def smol_args(smollm2):
    return ("-m", smollm2, "--drafter", "ngram", "-c", "1024", "-t", "1")


@pytest.fixture(scope="module")
def tiny(tiny_args):
    with live_server(*tiny_args) as live:
        yield live.client()


@pytest.fixture(scope="module")
def smol(smol_args):
    with live_server(*smol_args) as live:
        yield live.client()


def token_id(path, text: str) -> int:
    """A token's id by its text in the GGUF's vocabulary (a leading space is '▁' in SPM, 'Ġ' in BPE)."""
    info, _ = read_vocab(path)
    return [token.decode("utf-8", "replace") for token in info.token_texts].index(text)


def fresh_run(cli, model_args, text: str, *, special: bool) -> dict:
    """`specgguf run --raw` on `text`: a fresh start that served nothing before (its --json report)."""
    options = ("--temp", "0", "-k", "3", "-n", "12", "--json", "--raw", *(() if special else ("--no-special",)))
    run = cli("run", *model_args, *options, text)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def check_a_continued_completion(cli, client, model_args, *, first: str, cut: int, follow_up: str) -> None:
    """A completion of `first` cut after one token, `cut` (forced by logit_bias), then a completion of
    `follow_up`, which continues that text: it reads and answers `follow_up` as a fresh start does."""
    model = client.models.list().data[0].id
    cut_off = client.completions.create(model=model, prompt=first, max_tokens=1, logit_bias={str(cut): 100}, **GREEDY)
    assert follow_up.startswith(first + cut_off.choices[0].text)  # it continues the text served
    served = client.completions.create(model=model, prompt=follow_up, max_tokens=12, **GREEDY)
    fresh = fresh_run(cli, model_args, follow_up, special=False)
    assert (served.usage.prompt_tokens, served.choices[0].text) == (fresh["prompt_tokens"], fresh["text"])


def test_a_continued_completion_reads_its_text_as_a_fresh_start_does_spm(cli, tiny, tiny_args, tiny_verifier):
    # A space-prefix SPM tokenizer (LLaMA's): " hot" spliced on after "the water is" reads '▁', '▁hot'.
    check_a_continued_completion(
        cli, tiny, tiny_args, first="the water", cut=token_id(tiny_verifier, "▁is"), follow_up="the water is hot and"
    )


def test_a_completion_cut_in_mid_word_continues_as_a_fresh_start_does_bpe(cli, smol, smol_args, smollm2):
    # BPE (SmolLM2's): the answer stopped at " wat"; spliced on, the "er" the front-end sends next
    # stays apart from " wat", where the text's own tokenization reads " water".
    check_a_continued_completion(
        cli,
        smol,
        smol_args,
        first="I like to drink",
        cut=token_id(smollm2, "Ġwat"),
        follow_up="I like to drink water every morning because",
    )


def test_a_chat_follow_up_reads_the_conversation_as_a_fresh_start_does(cli, tiny, tiny_args):
    # The tiny model's answers are mostly not its tokenizer's own split of their text (random weights).
    question = [{"role": "user", "content": "tell me about the sea"}]
    first = tiny.chat.completions.create(model="verifier", messages=question, max_tokens=12, **GREEDY)
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    conversation = [*question, answer, {"role": "user", "content": "and the water?"}]
    served = tiny.chat.completions.create(model="verifier", messages=conversation, max_tokens=12, **GREEDY)
    text = jinja2.Template(DEFAULT_TEMPLATE).render(messages=conversation, add_generation_prompt=True)
    fresh = fresh_run(cli, tiny_args, text, special=True)
    assert (served.usage.prompt_tokens, served.choices[0].message.content) == (fresh["prompt_tokens"], fresh["text"])
