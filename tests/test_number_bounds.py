"""JSON-schema integers are bounded at 16 digits (grammar.bound_integers, as llama.cpp bounds them), so a
sampled `"age": 2500000000000…` cannot run until max_tokens, and the law of the numbers a model writes
within the bound is the model's own: the masks are the unbounded grammar's up to the 16th digit, and
sampled lengths follow the masked law (a chi-square count test)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLTokenizer
from scipy.stats import chisquare

from live_server import live_server
from specgguf.core.json_digits import DigitBound
from specgguf.grammar import MAX_INTEGER, GrammarSpec, GuidanceConstraint, bound_integers, number_bounds
from specgguf.serve.tool_syntax import _with_options

AGE = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"], "additionalProperties": False}
pytestmark = pytest.mark.live  # compiling a grammar starts a program (tests/kinds.py)


def _constraint(spec: GrammarSpec) -> tuple[LLTokenizer, GuidanceConstraint]:
    tokenizer = LLTokenizer("byte")
    return tokenizer, GuidanceConstraint(tokenizer, spec.compile(), tokenizer.vocab_size)


def _whole(spec: GrammarSpec, text: str) -> bool:
    tokenizer, constraint = _constraint(spec)
    tokens = tokenizer.tokenize_str(text)
    if constraint.valid_prefix(tokens) < len(tokens):
        return False
    for token in tokens:
        constraint.advance(token)
    return constraint.accepting


@pytest.mark.parametrize(
    "schema, text, whole",
    [
        (AGE, '{"age": 42}', True),
        (AGE, '{"age": -7}', True),
        (AGE, '{"age": 9999999999999999}', True),  # 16 digits
        (AGE, '{"age": -9999999999999999}', True),
        (AGE, '{"age": 25000000000000000}', False),  # 17: the runaway
        (AGE, '{"age": -25000000000000000}', False),
        ({"type": "integer", "minimum": 0}, "12345678901234567", False),  # a lower bound alone: still bounded
        ({"type": "integer", "minimum": 0}, "-1", False),  # the schema's own bound stands
        ({"type": "integer", "maximum": 10**17}, "12345678901234567", True),  # a wider bound it gives stands
        ({"type": ["integer", "null"]}, "12345678901234567", False),
        ({"type": ["integer", "null"]}, "null", True),
        ({"type": "number"}, "1.5e-3", True),  # numbers keep their exponent
        ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, "12345678901234567", False),
        ({"type": "array", "items": {"type": "integer"}}, "[1, 12345678901234567]", False),
    ],
)
def test_integers_are_bounded_at_16_digits(schema, text, whole):
    assert _whole(GrammarSpec.json_schema(schema), text) is whole


def test_values_and_property_names_are_not_schemas():
    schema = {
        "type": "object",
        "properties": {"default": {"type": "integer"}, "type": {"type": "string"}},
        "default": {"type": "integer"},
        "enum": [{"type": "integer"}],
    }
    bounded = bound_integers(schema)
    assert bounded["properties"]["default"] == {"type": "integer", "minimum": -MAX_INTEGER, "maximum": MAX_INTEGER}
    assert bounded["properties"]["type"] == {"type": "string"}
    assert bounded["default"] == {"type": "integer"} and bounded["enum"] == [{"type": "integer"}]
    assert schema["properties"]["default"] == {"type": "integer"}  # the caller's schema is not changed


def test_a_tools_integer_arguments_are_bounded_too():
    top = _with_options({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert top["properties"]["n"]["maximum"] == MAX_INTEGER and "x-guidance" in top


def test_the_mask_is_the_unbounded_grammars_up_to_the_16th_digit():
    unbounded = GrammarSpec("json_schema", json.dumps(AGE))
    assert "minimum" not in unbounded.text
    tokenizer, free = _constraint(unbounded)
    _, bounded = _constraint(GrammarSpec.json_schema(AGE))
    digits = [tokenizer.tokenize_str(d)[0] for d in "0123456789"]
    for token in tokenizer.tokenize_str('{"age": -'):
        free.advance(token), bounded.advance(token)
    for n_digits in range(16):
        assert np.array_equal(free.allowed(), bounded.allowed()), n_digits
        free.advance(digits[1 + n_digits % 9]), bounded.advance(digits[1 + n_digits % 9])
    assert free.allowed()[digits].all() and not bounded.allowed()[digits].any()  # the bound, at 16


def _sampled_lengths(tokenizer_and_constraint, prefix_text, digit_mass, end_mass, n_samples, n_cells):
    """After `prefix_text`, a model that writes a digit (each `digit_mass`) or "}" (`end_mass`), masked by
    the constraint, sampled `n_samples` times: how many answers had each number of tokens before the end."""
    tokenizer, constraint = tokenizer_and_constraint
    end = tokenizer.tokenize_str("}")[0]
    model = np.zeros(tokenizer.vocab_size)
    model[[tokenizer.tokenize_str(d)[0] for d in "0123456789"]] = digit_mass
    model[end] = end_mass
    prefix = tokenizer.tokenize_str(prefix_text)
    rng = np.random.default_rng(48)
    counts = np.zeros(n_cells, dtype=int)
    for _ in range(n_samples):
        for token in prefix:
            constraint.advance(token)
        n_tokens, token = len(prefix), -1
        while not constraint.accepting or token != end:
            weights = model * constraint.allowed()
            token = int(rng.choice(len(weights), p=weights / weights.sum()))
            constraint.advance(token)
            n_tokens += 1
        counts[n_tokens - len(prefix) - 1] += 1
        constraint.rollback(n_tokens)
    return counts


def test_sampled_lengths_follow_the_models_law_within_the_bound():
    # A model writing the age: a first digit uniform over 0-9, then another digit (0.07 each) or the end
    # "}" (0.3); every other byte has no mass. Masked by the grammar: a leading 0 ends at once, and the
    # 16th digit ends the number. Its law: P(1) = 0.1 + 0.9 * 0.3, P(k) = 0.9 * 0.7^(k-1) * 0.3 for
    # 2 <= k <= 15, P(16) = 0.9 * 0.7^15.
    n_samples = 4000
    counts = _sampled_lengths(_constraint(GrammarSpec.json_schema(AGE)), '{"age": ', 0.07, 0.3, n_samples, 17)
    law = np.zeros(17)
    law[1] = 0.1 + 0.9 * 0.3
    law[2:16] = 0.9 * 0.7 ** np.arange(1, 15) * 0.3
    law[16] = 0.9 * 0.7**15
    assert counts[0] == 0 and counts[16] > 0  # some reach the bound, none go past it
    expected = law[1:] * n_samples
    assert expected.min() >= 5  # every cell large enough for the chi-square
    assert chisquare(counts[1:], expected).pvalue > 1e-3


# --- numbers: each part's digits bounded over the grammar's masks (core/json_digits.py) ---

MASS = {
    "type": "object",
    "properties": {"mass": {"type": "number"}},
    "required": ["mass"],
    "additionalProperties": False,
}


def _bounded(spec: GrammarSpec) -> tuple[LLTokenizer, DigitBound]:
    """The grammar as constraint_for gives it: a JSON schema's numbers bounded in digits."""
    tokenizer, constraint = _constraint(spec)
    texts = [tokenizer.decode_bytes([token]) for token in range(tokenizer.vocab_size)]
    return tokenizer, DigitBound(constraint, texts, number_bounds(json.loads(spec.text)))


def _takes(spec: GrammarSpec, text: str) -> bool:
    tokenizer, constraint = _bounded(spec)
    tokens = tokenizer.tokenize_str(text)
    if constraint.valid_prefix(tokens) < len(tokens):
        return False
    for token in tokens:
        assert constraint.allowed()[token]  # the mask says what valid_prefix says
        constraint.advance(token)
    return constraint.accepting


@pytest.mark.parametrize(
    "schema, text, whole",
    [
        (MASS, '{"mass": 1.5e-3}', True),  # numbers keep their exponent
        (MASS, '{"mass": -0.30000000000000004}', True),  # a double as Python prints it (17 decimals)
        (MASS, '{"mass": 1.2345678901234567e-07}', True),
        (MASS, '{"mass": 0.000000123456789012345678}', True),  # 24 decimals
        (MASS, '{"mass": 0.3333333333333333333333333}', False),  # 25: the runaway
        (MASS, '{"mass": 9999999999999999.5}', True),  # 16 integral digits
        (MASS, '{"mass": 25000000000000000}', False),  # 17
        (MASS, '{"mass": 1e-0000000000000001}', True),  # 16 exponent digits
        (MASS, '{"mass": 1E+00000000000000001}', False),  # 17
        ({"type": "string"}, '"' + "3" * 40 + '"', True),  # a string's digits are the string's
        (
            {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}}},
            '{"s": "a\\"' + "1" * 30 + '", "n": 2}',  # an escaped quote: still in the string
            True,
        ),
        ({"type": "integer", "maximum": 10**17}, "12345678901234567", True),  # a wider bound it gives stands
        ({"type": "array", "items": {"type": "number"}}, "[1.25, 3.0, 1234567890123456789]", False),
    ],
)
def test_numbers_are_bounded_in_each_part(schema, text, whole):
    assert _takes(GrammarSpec.json_schema(schema), text) is whole


def test_the_mask_is_the_unbounded_grammars_up_to_the_24th_decimal():
    tokenizer, free = _constraint(GrammarSpec.json_schema(MASS))
    _, bounded = _bounded(GrammarSpec.json_schema(MASS))
    digits = [tokenizer.tokenize_str(d)[0] for d in "0123456789"]
    for token in tokenizer.tokenize_str('{"mass": -12.'):
        free.advance(token), bounded.advance(token)
    for n_digits in range(24):
        assert np.array_equal(free.allowed(), bounded.allowed()), n_digits
        free.advance(digits[n_digits % 10]), bounded.advance(digits[n_digits % 10])
    allowed = bounded.allowed()
    assert free.allowed()[digits].all() and not allowed[digits].any()  # the bound, at 24
    assert allowed[tokenizer.tokenize_str("e")[0]] and allowed[tokenizer.tokenize_str("}")[0]]
    bounded.rollback(3)  # back under the bound: digits again
    assert bounded.allowed()[digits].all()


def test_sampled_decimals_follow_the_models_law_within_the_bound():
    # A model writing the mass after `0.`: another digit (0.085 each) or the end "}" (0.15); every other
    # byte has no mass. Masked: at least one decimal, and the 24th ends the fraction. Its law over the
    # number of decimals: P(k) = 0.85^(k-1) * 0.15 for 1 <= k <= 23, P(24) = 0.85^23.
    n_samples = 3000
    counts = _sampled_lengths(_bounded(GrammarSpec.json_schema(MASS)), '{"mass": 0.', 0.085, 0.15, n_samples, 26)
    law = np.zeros(25)
    law[1:24] = 0.85 ** np.arange(0, 23) * 0.15
    law[24] = 0.85**23
    assert counts[0] == 0 and counts[24] > 0 and counts[25] == 0  # some reach the bound, none go past it
    expected = law[1:] * n_samples
    assert expected.min() >= 5  # every cell large enough for the chi-square
    assert chisquare(counts[1:25], expected).pvalue > 1e-3


@pytest.mark.slow
def test_a_client_asking_for_many_decimals_gets_a_whole_object(qwen_pair):
    """The real `openai` client and the default pair: asked for pi to 60 decimals under a schema with a
    `number`, the model writes digits until the bound (24), then the object closes, whole."""
    verifier, draft = qwen_pair
    schema = {
        "type": "object",
        "properties": {"pi": {"type": "number"}},
        "required": ["pi"],
        "additionalProperties": False,
    }
    with live_server("-m", verifier, "-md", draft, "-c", "1024", "--parallel", "1", startup_timeout=240) as server:
        response = server.client(timeout=300).chat.completions.create(
            model="coder",
            messages=[{"role": "user", "content": "Write pi to 60 decimal places, as JSON."}],
            temperature=0,
            max_tokens=120,
            response_format={"type": "json_schema", "json_schema": {"name": "pi", "schema": schema, "strict": True}},
        )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    text = choice.message.content
    assert json.loads(text)["pi"] == pytest.approx(3.14159265358979)
    decimals = text.split(".", 1)[1].split("}")[0].strip()
    assert len(decimals) == 24  # it wrote up to the bound, and no further
