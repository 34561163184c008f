"""Grammars over real GGUF vocabularies (specgguf/grammar.py over llguidance): JSON schemas, GBNF, the
CLI's --json-schema/--grammar, the speculative answer that validates, and bad grammars refused by name."""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
from llguidance import LLTokenizer

from specgguf.core.drafters import DraftSettings, build_drafter
from specgguf.core.engine import FixedK, speculate
from specgguf.core.events import GenerationStats
from specgguf.core.sampling import SamplingSettings
from specgguf.grammar import MAX_SCHEMA_DEPTH, GrammarError, GrammarSpec, GuidanceConstraint, constraint_for
from specgguf.llama.model import LlamaModel

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pair(tiny_verifier, tiny_draft):
    return LlamaModel(tiny_verifier, n_ctx=512), LlamaModel(tiny_draft, n_ctx=512)


def _answer(pair, spec, *, k, temperature, seed, kind="hybrid", max_tokens=120):
    verifier, draft = pair
    verifier.clear()
    draft.clear()
    stats = GenerationStats()
    tokens = []
    for event in speculate(
        verifier=verifier,
        drafter=build_drafter(kind, draft, DraftSettings()),
        prompt_tokens=verifier.tokenize("the cat was"),
        k=FixedK(k),
        max_tokens=max_tokens,
        settings=SamplingSettings(temperature=temperature),
        rng=np.random.default_rng(seed),
        constraint=constraint_for(verifier, spec),
    ):
        stats.add(event)
        tokens += event.tokens
    return b"".join(verifier.token_bytes(t) for t in tokens).decode("utf-8", "replace"), stats


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_answers_under_a_json_schema_validate_and_forced_tokens_are_free_drafts(pair, temperature):
    sources = set()
    for seed in range(3):
        text, stats = _answer(pair, GrammarSpec.json_schema(SCHEMA), k=4, temperature=temperature, seed=seed)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert stats.stop == "eos"  # the grammar ended the answer
        sources |= set(stats.accepted_by_source)
    assert "grammar" in sources  # `{"name": "` and `", "count": ` are forced


def test_greedy_under_a_grammar_is_the_same_with_and_without_speculation(pair):
    spec = GrammarSpec.json_schema(SCHEMA)
    plain, plain_stats = _answer(pair, spec, k=0, temperature=0.0, seed=0)
    fast, stats = _answer(pair, spec, k=4, temperature=0.0, seed=0)
    assert fast == plain and plain_stats.n_drafted == 0 and stats.n_accepted > 0


def test_json_object_and_a_gbnf_grammar(pair):
    # A random model writes one string for ever: the answer is cut, an unfinished object (the live
    # tests with the real pair see json_object answers end).
    text, _ = _answer(pair, GrammarSpec("json_object"), k=3, temperature=0.8, seed=1, max_tokens=60)
    assert text.startswith('{"')
    text, _ = _answer(pair, GrammarSpec("gbnf", 'root ::= ("yes" | "no") "!"'), k=3, temperature=0.8, seed=2)
    assert text in ("yes!", "no!")


def test_the_mask_is_the_grammars(pair):
    verifier, _ = pair
    constraint = constraint_for(verifier, GrammarSpec("json_object"))
    allowed = constraint.allowed()
    assert allowed.shape == (verifier.n_vocab,) and allowed.sum() >= 1
    assert all(verifier.token_bytes(int(t)).lstrip().startswith(b"{") for t in np.flatnonzero(allowed))


def _whole(spec: GrammarSpec, text: str) -> bool:
    """Whether `text` is a whole answer under the grammar, over llguidance's byte vocabulary."""
    tokenizer = LLTokenizer("byte")
    constraint = GuidanceConstraint(tokenizer, spec.compile(), tokenizer.vocab_size)
    tokens = tokenizer.tokenize_str(text)
    if constraint.valid_prefix(tokens) < len(tokens):
        return False
    for token in tokens:
        constraint.advance(token)
    return constraint.accepting


@pytest.mark.parametrize(
    "text, whole",
    [
        ('{"name":"Ada","count":3}', True),  # compact
        ('{"name": "Ada", "count": 3}', True),  # one line, as most models write it
        ('{\n  "name": "Ada",\n  "count": 3\n}', True),  # pretty-printed
        ('{\n\t"name": "Ada",\n\n\t"count": 3\n}', True),  # tabs, a blank line
        ('{"name": "Ada", "count": 3, "extra": 1}', False),  # the schema still rules
        ('{"name":  "Ada", "count": 3}', False),  # two spaces on a line: whitespace is bounded
        ('{"name": "Ada",\n\n\n"count": 3}', False),  # three line breaks
        ('{"name": "Ada",\n' + " " * 21 + '"count": 3}', False),  # an indent over 20
        (' {"name": "Ada", "count": 3}', False),  # nothing before the JSON
    ],
    ids=["compact", "one-line", "pretty", "tabs", "extra-key", "two-spaces", "three-breaks", "indent-21", "lead"],
)
@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_json_takes_the_models_whitespace_within_a_bound(text, whole):
    assert _whole(GrammarSpec.json_schema(SCHEMA), text) is whole
    assert _whole(GrammarSpec("json_object"), text) is (whole or "extra" in text)


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_one_of_is_read_as_any_of():
    # Branches llguidance cannot prove disjoint (pydantic's unions): compiled as anyOf, as vLLM does.
    spec = GrammarSpec.json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    assert _whole(spec, "3") and _whole(spec, "2.5")


def _deep(depth):
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    "spec, message",
    [
        (lambda: GrammarSpec("gbnf", "root ::= missing_rule"), "gbnf is not valid"),
        (lambda: GrammarSpec("json_schema", "[1, 2]"), "must be a JSON object"),
        (lambda: GrammarSpec("json_schema", "{not json"), "json_schema is not valid"),
        (lambda: GrammarSpec.json_schema(_deep(MAX_SCHEMA_DEPTH)), f"deeper than {MAX_SCHEMA_DEPTH}"),
        (lambda: GrammarSpec.json_schema({"type": "frobnicate"}), "json_schema is not valid"),
    ],
    ids=["gbnf", "not-an-object", "not-json", "too-deep", "bad-type"],
)
@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_bad_grammars_are_refused_by_name(spec, message):
    with pytest.raises(GrammarError, match=message):
        spec().compile()


@pytest.fixture(scope="module")
def tiny(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "512"]


def test_run_json_schema_answers_json_that_validates(cli, tiny, tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    result = cli("run", *tiny, "--json-schema", schema_file, "-n", "120", "--seed", "4", "the dog")
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), SCHEMA)
    report = json.loads(cli("run", *tiny, "--json-schema", schema_file, "-n", "120", "--json", "a").stdout)
    jsonschema.validate(json.loads(report["text"]), SCHEMA)


def test_run_grammar_follows_a_gbnf_file(cli, tiny, tmp_path):
    grammar_file = tmp_path / "answer.gbnf"
    grammar_file.write_text('root ::= "answer: " ("yes" | "no")\n')
    result = cli("run", *tiny, "--grammar", grammar_file, "-n", "20", "is it?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("answer: yes", "answer: no")


def test_run_takes_one_grammar_at_most(cli, tmp_path):
    (tmp_path / "s.json").write_text("{}")
    (tmp_path / "g.gbnf").write_text('root ::= "a"')
    result = cli("run", "--json-schema", tmp_path / "s.json", "--grammar", tmp_path / "g.gbnf", "hi")
    assert "not both" in result.error_line()


@pytest.mark.parametrize(
    "content, option, message",
    [
        ("[1]", "--json-schema", "must be a JSON object"),
        ("{oops", "--json-schema", "is not JSON"),
        ("root ::= (", "--grammar", "gbnf is not valid"),
        (None, "--grammar", "cannot read"),
    ],
)
@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_run_refuses_a_bad_grammar_file_before_loading_anything(cli, tmp_path, content, option, message):
    path = tmp_path / "g.txt"
    if content is not None:
        path.write_text(content)
    result = cli("run", "-m", tmp_path / "missing.gguf", option, path, "hi")
    assert message in result.error_line()
