"""The tool-call pieces without a server: the lazy grammar (core/lazy_grammar.py) under the engine's exact
rule, and each family's parser (serve/tool_syntax.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeModel, TableConstraint
from specgguf.core.engine import FixedK, speculate
from specgguf.core.lazy_grammar import LazyGrammar
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.serve.tool_syntax import SYNTAXES, ParsedCall, Tool, family_of

VOCAB, OPEN, END = 6, 4, 5  # a call: OPEN, then 1 or 2, then 3 (it closes)


class Call(TableConstraint):
    def __init__(self):
        super().__init__(
            {0: {1, 2}, 1: {3}, 2: set(range(VOCAB))}, lambda state, token: min(state + 1, 2), n_vocab=VOCAB
        )

    @property
    def accepting(self):
        return self.state == 2


def _lazy(*, required=False, parallel=True, calls=True, openers=((OPEN,),)):
    end, between = np.zeros(VOCAB, dtype=bool), np.zeros(VOCAB, dtype=bool)
    end[END] = True
    between[0] = True
    return LazyGrammar(
        n_vocab=VOCAB,
        openers=openers,
        calls=[Call] * len(openers) if calls else None,
        end=end,
        between=between,
        required=required,
        parallel=parallel,
    )


def _answer(grammar, seed, k=3):
    logits = np.random.default_rng(seed).normal(size=(VOCAB, VOCAB))
    verifier = FakeModel(lambda context: logits[context[-1]], n_vocab=VOCAB, eog=[END])
    events = speculate(
        verifier=verifier,
        drafter=NgramDrafter(min_ngram=1),
        prompt_tokens=[0, 4, 1, 3, 0, 4],
        k=FixedK(k),
        max_tokens=30,
        settings=SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        rng=np.random.default_rng(seed),
        constraint=grammar,
    )
    return [token for event in events for token in event.tokens]


def _calls_are_well_formed(tokens, *, free_start):
    text = list(tokens)
    if free_start:
        text = text[text.index(OPEN) :] if OPEN in text else []
    i = 0
    while i < len(text) and text[i] != END:
        if text[i] == OPEN:
            assert text[i + 1 : i + 3] in ([1, 3], [2, 3]) or len(text) - i <= 2, tokens
            i += 3
        else:
            assert text[i] == 0, tokens  # only whitespace between calls
            i += 1


@pytest.mark.parametrize("seed", range(20))
def test_calls_follow_their_grammar_wherever_the_model_opens_one(seed):
    grammar = _lazy()
    tokens = _answer(grammar, seed)
    _calls_are_well_formed(tokens, free_start=True)
    assert grammar.tokens[: len(tokens)] == tokens and len(grammar.tokens) - len(tokens) <= 1  # + the end token


@pytest.mark.parametrize("seed", range(10))
def test_required_opens_at_once_and_parallel_false_ends_after_one_call(seed):
    tokens = _answer(_lazy(required=True, parallel=False), seed)
    assert tokens[0] == OPEN and tokens[1] in (1, 2) and tokens[2] == 3
    assert set(tokens[3:]) <= {0}  # then whitespace at most, never a second call, till the end


def test_a_multi_token_opener_and_tool_choice_none():
    grammar = _lazy(openers=((0, OPEN),))
    for token in (1, 0, OPEN):
        grammar.advance(token)
    assert grammar.mode == "call" and list(np.flatnonzero(grammar.allowed())) == [1, 2]
    grammar.rollback(1)
    assert grammar.mode == "free" and not grammar.calls
    assert grammar.valid_prefix([OPEN, 3]) == 1 and grammar.tokens == [1, 0]
    none = _lazy(calls=False)
    assert not none.allowed()[OPEN] and none.allowed()[:OPEN].all()


TOOLS = [Tool("add", None, {"type": "object"}), Tool("get_weather", None, {"type": "object"})]


@pytest.mark.parametrize(
    "family, text, calls",
    [
        (
            "hermes",
            '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arg',
            [ParsedCall("add", '{"a": 1}', True), ParsedCall("get_weather", "", False)],
        ),
        (
            "hermes",
            '```json\n{\n  "name": "add",\n  "arguments": {"a": 2}\n}\n```',
            [ParsedCall("add", '{"a": 2}', True)],
        ),
        (
            "hermes",
            'Sure. {{"name": "add", "arguments": {"a": 2}}}\n{{"name": "get_weather", "arguments": {}}}',
            [ParsedCall("add", '{"a": 2}', True), ParsedCall("get_weather", "{}", True)],
        ),
        (
            "llama3",
            '{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {"city": "Rome"}}',
            [ParsedCall("add", '{"a": 1}', True), ParsedCall("get_weather", '{"city": "Rome"}', True)],
        ),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {"a": 3}}]',
            [ParsedCall("add", '{"a": 1}', True), ParsedCall("add", '{"a": 3}', True)],
        ),
    ],
    ids=["hermes", "qwen-coder-json-block", "qwen-coder-doubled-braces", "llama3", "mistral"],
)
def test_each_family_parses_its_calls(family, text, calls):
    syntax = SYNTAXES[family]
    found = [at for at in (text.find(opener) for opener in syntax.openers) if at >= 0]
    region = text[min(found) :] if found else text
    assert syntax.parse(region) == calls


def test_the_family_comes_from_the_template():
    assert family_of("... <tool_call> ...") == family_of(None) == "hermes"
    assert family_of("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert family_of("<|python_tag|> <|eom_id|>") == "llama3"


def test_the_call_grammar_names_each_tool_and_its_schema():
    lark = SYNTAXES["hermes"].call_lark(TOOLS, lambda text: "<[7]>")
    assert lark.startswith("start: call_0 | call_1\n")
    assert '"\\n{\\"name\\": \\"add\\", \\"arguments\\": " args_0 "}\\n" <[7]>' in lark
    assert 'args_1: %json {"type": "object"}' in lark
    # The doubled-brace form: its opener wrote '{"name": "' already; the grammar writes the rest.
    doubled = SYNTAXES["hermes"].forms[2]
    lark = SYNTAXES["hermes"].call_lark(TOOLS, lambda text: "<[7]>", doubled)
    assert doubled.opener == '{{"name": "' and 'call_0: "add\\", \\"arguments\\": " args_0 "}}"' in lark
