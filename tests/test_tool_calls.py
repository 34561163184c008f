"""The tool-call pieces without a server: the lazy grammar (core/lazy_grammar.py) under the engine's exact
rule, each family's parser (serve/tool_syntax.py) and the call grammar over llguidance's byte vocabulary,
and the stream that splits an answer into content and calls (serve/tools.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLTokenizer

from fakes import FakeModel, TableConstraint
from specgguf.core.engine import FixedK, speculate
from specgguf.core.lazy_grammar import MAX_BETWEEN, LazyGrammar
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.core.sampling import SamplingSettings
from specgguf.grammar import GrammarSpec, GuidanceConstraint
from specgguf.serve.text import AnswerText
from specgguf.serve.tool_syntax import SYNTAXES, ParsedCall, Tool, family_of
from specgguf.serve.tools import CallStream, Function, ToolPlan, ToolsError, call_stream, plan_tools

VOCAB, OPEN, END = 6, 4, 5  # a call: OPEN, then 1 or 2, then 3 (it closes)


class Call(TableConstraint):
    def __init__(self):
        super().__init__(
            {0: {1, 2}, 1: {3}, 2: set(range(VOCAB))}, lambda state, token: min(state + 1, 2), n_vocab=VOCAB
        )

    @property
    def accepting(self):
        return self.state == 2


def _lazy(*, required=False, parallel=True, openers=((OPEN,),)):
    end, between = np.zeros(VOCAB, dtype=bool), np.zeros(VOCAB, dtype=bool)
    end[END] = True
    between[0] = True
    return LazyGrammar(
        n_vocab=VOCAB,
        openers=openers,
        calls=[Call] * len(openers),
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


def test_a_multi_token_opener():
    grammar = _lazy(openers=((0, OPEN),))
    for token in (1, 0, OPEN):
        grammar.advance(token)
    assert grammar.mode == "call" and list(np.flatnonzero(grammar.allowed())) == [1, 2]
    grammar.rollback(1)
    assert grammar.mode == "free" and not grammar.calls
    assert grammar.valid_prefix([OPEN, 3]) == 1 and grammar.tokens == [1, 0]


@pytest.mark.parametrize("parallel", [True, False])
def test_whitespace_after_a_call_is_bounded(parallel):
    grammar = _lazy(parallel=parallel)
    for token in (OPEN, 1, 3):
        grammar.advance(token)
    after_call = {END, OPEN} if parallel else {END}
    for _ in range(MAX_BETWEEN):
        assert set(np.flatnonzero(grammar.allowed())) == {0} | after_call
        grammar.advance(0)
    assert set(np.flatnonzero(grammar.allowed())) == after_call  # no more whitespace: the end or a call
    grammar.rollback(1)
    assert grammar.allowed()[0]


TOOLS = [Tool("add", None, {"type": "object"}), Tool("get_weather", None, {"type": "object"})]
NAMES = [tool.name for tool in TOOLS]
PRETTY = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}'
PARIS = ParsedCall("get_weather", '{\n    "city": "Paris"\n  }', True)


@pytest.mark.parametrize(
    "family, text, calls",
    [
        (
            "hermes",
            '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arg',
            [ParsedCall("add", '{"a": 1}', True), ParsedCall("get_weather", "", False)],
        ),
        ("hermes", f"<tool_call>\n{PRETTY}\n</tool_call>", [PARIS]),
        ("hermes", f"Let me look.\n```json\n{PRETTY}\n```", [PARIS]),
        ("hermes", f"```\n{PRETTY}\n```", [PARIS]),
        ("hermes", f"\n{PRETTY}", [PARIS]),
        ("hermes", 'I will check. {"name": "add", "arguments": {"a": 2}}', [ParsedCall("add", '{"a": 2}', True)]),
        ("hermes", '{ "name" : "add" , "arguments" : {"a": 2} }', [ParsedCall("add", '{"a": 2}', True)]),
        ("hermes", '<tool_call>\n{"name": "get_weather"}\n</tool_call>', [ParsedCall("get_weather", "{}", True)]),
        ("hermes", '{"name": "add", "arguments": "{\\"a\\": 2}"}', [ParsedCall("add", '{"a": 2}', True)]),
        ("hermes", '{"name": "Ada", "born": 1815}', []),  # JSON that names no tool is no call
        ("hermes", 'Here: {"name": "Ada"} and {"name": "add", "arguments": {}}', [ParsedCall("add", "{}", True)]),
        ("hermes", "<tool_call>\n{", [ParsedCall(None, "", False)]),  # a call begun, its name still to come
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
    ids=[
        "hermes",
        "hermes-multi-line",
        "fenced-json-after-text",
        "fenced",
        "bare-multi-line",
        "bare-after-text",
        "spaced-separators",
        "no-arguments",
        "arguments-as-a-string",
        "not-a-tool",
        "a-tool-after-other-json",
        "cut-before-the-name",
        "qwen-coder-doubled-braces",
        "llama3",
        "mistral",
    ],
)
def test_each_family_parses_its_calls(family, text, calls):
    syntax = SYNTAXES[family]
    start = syntax.call_start(text, NAMES)
    assert (syntax.parse(text[start:], NAMES) if start is not None else []) == calls


def test_the_family_comes_from_the_template():
    assert family_of("... <tool_call> ...") == family_of(None) == "hermes"
    assert family_of("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert family_of("<|python_tag|> <|eom_id|>") == "llama3"


def _follows(lark: str, text: str) -> bool:
    """Whether `text` is a whole call under the grammar, over llguidance's byte vocabulary."""
    tokenizer = LLTokenizer("byte")
    grammar = GuidanceConstraint(tokenizer, GrammarSpec("lark", lark).compile(), tokenizer.vocab_size)
    tokens = tokenizer.tokenize_str(text)
    if grammar.valid_prefix(tokens) < len(tokens):
        return False
    for token in tokens:
        grammar.advance(token)
    return grammar.accepting


CALL = '{"name": "add", "arguments": {"a": 1}}'


@pytest.mark.parametrize(
    "family, form, text, follows",
    [
        ("hermes", 0, f"\n{CALL}\n</tool_call>", True),  # Qwen's own layout
        ("hermes", 0, '{"name":"add","arguments":{"a":1}}</tool_call>', True),  # compact
        ("hermes", 0, f"\n{PRETTY}\n</tool_call>", True),  # pretty-printed
        ("hermes", 0, '\n{"name": "fly", "arguments": {}}\n</tool_call>', False),  # not a tool
        ("hermes", 0, f"\n{CALL}\n\n\n</tool_call>", False),  # whitespace is bounded: two line breaks
        ("hermes", 0, '\n{"name": "add", "arguments": {"a":' + " " * 2 + "1}}\n</tool_call>", False),  # one space
        ("hermes", 0, '\n{"name": "add", "arguments": {\n' + " " * 21 + '"a": 1}}\n</tool_call>', False),
        ("hermes", 0, f"\n\n{CALL}\n\n</tool_call>", True),  # a blank line around the call
        # Around the call no indent: Qwen at T = 0.8 wrote 20 spaces before the closer, 19 tokens billed
        # that no client sees (issue 48: "42 tokens for a 22-token call").
        ("hermes", 0, f"\n\n{CALL}\n\n" + " " * 20 + "</tool_call>", False),
        ("hermes", 0, f"\n  {CALL}\n</tool_call>", False),
        ("hermes", 1, f"{PRETTY}\n```", True),
        ("hermes", 2, 'add", "arguments": {"a": 1}}}', True),  # the doubled braces: the name on
        ("hermes", 2, 'get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}}', True),
        ("llama3", 0, '{"name": "add", "parameters": {"a": 1}}', True),
        ("mistral", 0, f"[{CALL}]", True),
    ],
    ids=[
        "one-line",
        "compact",
        "pretty",
        "unknown-tool",
        "three-line-breaks",
        "two-spaces",
        "indent-21",
        "blank-lines-around",
        "indented-closer",
        "indented-call",
        "fenced-pretty",
        "doubled-braces",
        "doubled-braces-pretty",
        "llama3",
        "mistral",
    ],
)
@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_the_call_grammar_takes_the_models_layout_within_bounds(family, form, text, follows):
    syntax = SYNTAXES[family]
    assert _follows(syntax.call_lark(TOOLS, json.dumps, syntax.forms[form]), text) is follows


def _stream(text: str, *, family="hermes", stop="eos", chunk=3):
    """`text` through a CallStream a few characters at a time (one byte a token), as the server reads
    an answer: the content it shows, the calls streamed as deltas, and how it ends."""
    calls = CallStream(family, lambda token: bytes([token]), names=NAMES)
    answer = AnswerText(lambda token: bytes([token]), calls.syntax.openers)
    data = list(text.encode())
    content, streamed = "", dict[int, dict]()
    for at in range(0, len(data), chunk):
        for delta in calls.feed(data[at : at + chunk]):
            entry = streamed.setdefault(delta.index, {"name": delta.name, "arguments": ""})
            entry["arguments"] += delta.arguments
        content += calls.content(answer.add(data[at : at + chunk]))
    content += calls.finish(answer, stop)
    reason, whole = calls.result()
    assert list(streamed.values()) == [
        {"name": call.name, "arguments": call.arguments} for call in whole
    ]  # the stream is the whole answer
    return content, reason, [(call.name, call.arguments) for call in whole]


@pytest.mark.parametrize(
    "text, content, reason, calls",
    [
        (f"Checking.\n{PRETTY}", "Checking.\n", "tool_calls", [("get_weather", PARIS.arguments)]),
        (f"Checking.\n<tool_call>\n{CALL}\n</tool_call>", "Checking.\n", "tool_calls", [("add", '{"a": 1}')]),
        ('{"name": "Ada", "born": 1815}', '{"name": "Ada", "born": 1815}', None, []),
        ("a {b} c {", "a {b} c {", None, []),  # held back while it might open a call, then let out
        ("Done.\n```json\n[1, 2]\n```", "Done.\n```json\n[1, 2]\n```", None, []),
    ],
    ids=["bare", "hermes", "json-not-a-call", "braces", "fenced-not-a-call"],
)
def test_content_ends_where_a_call_begins_and_text_that_held_none_is_content(text, content, reason, calls):
    assert _stream(text) == (content, reason, calls)


def test_a_call_cut_by_max_tokens_ends_as_length_with_its_arguments_so_far():
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    assert _stream(cut, stop="max_tokens") == ("", "length", [("get_weather", '{"city": "Par')])
    # Cut before the name ends: no call to report, and none of its markup as content (issue 48).
    assert _stream('OK <tool_call>\n{"na', stop="max_tokens") == ("OK ", "length", [])
    assert _stream("<tool_call>", stop="max_tokens") == ("", "length", [])
    assert _stream('<tool_call>\n{"name": "get_wea', stop="max_tokens") == ("", "length", [])
    assert _stream('OK {"name": "get_wea', stop="max_tokens") == ("OK ", "length", [])  # bare, a tool's name
    # Bare JSON whose name begins no tool's, or that has no name yet, may be anything: content.
    assert _stream('OK {"name": "Ad', stop="max_tokens") == ('OK {"name": "Ad', "length", [])
    assert _stream('OK {"na', stop="max_tokens") == ('OK {"na', "length", [])
    # Whole calls, then the answer cut between them: still the calls.
    whole = f"<tool_call>\n{CALL}\n</tool_call>"
    assert _stream(whole, stop="max_tokens") == ("", "tool_calls", [("add", '{"a": 1}')])


def test_tool_choice_none_reads_no_call():
    plan = ToolPlan(TOOLS, [], "none", parallel=True)
    assert call_stream(plan, "hermes", bytes) is None
    assert call_stream(ToolPlan(TOOLS, [], "auto", parallel=True), "hermes", bytes) is not None


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_plan_tools_is_every_apis_one_check():
    weather = Function("get_weather", "The weather", {"type": "object"}, "tools[0].input_schema")
    bare = Function("ping", None, None, "tools[1].input_schema")
    plan = plan_tools([weather, bare], choice=None, named="ping", parallel=False)
    assert plan is not None and (plan.choice, plan.parallel) == ("ping", False)
    assert [tool.parameters for tool in plan.tools] == [{"type": "object"}, {"type": "object"}]  # none: any object
    assert plan.definitions == [  # OpenAI's shape, which chat templates read, as the request gave it
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "The weather", "parameters": {"type": "object"}},
        },
        {"type": "function", "function": {"name": "ping"}},
    ]
    assert plan_tools([], choice="none") is None and plan_tools([], choice=None) is None
    for functions, options, param in (
        ([], {"choice": "required"}, "tool_choice"),
        ([weather], {"choice": None, "named": "fly"}, "tool_choice"),
        ([weather, weather], {"choice": None}, "tools"),
        ([Function("a b", None, None, "tools[0].input_schema")], {"choice": None}, "tools[0].name"),
        ([Function("x", None, {"type": "nope"}, "tools[0].input_schema")], {"choice": None}, "tools[0].input_schema"),
        (
            [weather],
            {"choice": None, "called": [("fly", "messages[1].content[0].name")]},
            "messages[1].content[0].name",
        ),
        ([weather], {"choice": None, "conflicting": "'format'"}, "tools"),
    ):
        with pytest.raises(ToolsError) as refused:
            plan_tools(functions, **options)
        assert refused.value.param == param
