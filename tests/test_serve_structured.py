"""Structured output through the server (response_format json_object / json_schema, llama-server's
`grammar`), with the real openai SDK against a live server on the tiny GGUF pair."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from pydantic import BaseModel, Field

from live_server import live_server

MODEL = "verifier"
SCHEMA = {
    "type": "object",
    "properties": {"word": {"enum": ["cat", "dog", "sea"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["word", "count"],
    "additionalProperties": False,
}


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def server(tiny_verifier, tiny_draft):
    # -n 200: a random model spends many tokens on the whitespace JSON allows (grammar.WHITESPACE).
    with live_server("-m", tiny_verifier, "-md", tiny_draft, "-c", "512", "-t", "1", "-n", "200") as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _ask(client, **options):
    options.setdefault("extra_body", {"speculative": {"k": 3}})  # a fixed K: a seed repeats the answer
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "the cat and the dog"}], **options
    )


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_json_schema_answers_validate_whole_and_streamed(client, temperature):
    response_format = {"type": "json_schema", "json_schema": {"name": "pets", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        response = _ask(client, response_format=response_format, temperature=temperature, seed=seed)
        assert response.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(response.choices[0].message.content), SCHEMA)
        accepted = response.model_extra["timings"]["draft_n_accepted_by_source"]
        chunks = list(_ask(client, response_format=response_format, temperature=temperature, seed=seed, stream=True))
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == response.choices[0].message.content
    assert accepted.get("grammar", 0) > 0  # '{"word":"' and '","count":' are forced: free drafts


def test_the_sdks_parse_gets_a_pydantic_object(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "is it?"}], response_format=Verdict, temperature=0.7
    )
    verdict = completion.choices[0].message.parsed
    assert isinstance(verdict, Verdict) and verdict.answer in ("yes", "no")


def test_json_object_and_a_gbnf_grammar(client):
    response = _ask(client, response_format={"type": "json_object"}, max_tokens=40, temperature=0)
    # A random model may not close it in 40 tokens; the first key comes after the model's own whitespace.
    assert re.match(r'\{\s*"', response.choices[0].message.content)
    response = _ask(client, extra_body={"grammar": 'root ::= "the " ("cat" | "dog") "."'}, temperature=0.8)
    assert response.choices[0].message.content in ("the cat.", "the dog.")
    assert _ask(client, response_format={"type": "text"}, max_tokens=4).choices[0].message.content


@pytest.mark.parametrize(
    "options, param, message",
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "is missing"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format",
            "json_schema is not valid",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'"),
        ({"extra_body": {"grammar": "root ::= ("}}, "grammar", "gbnf is not valid"),
        (
            {"extra_body": {"grammar": 'root ::= "a"'}, "response_format": {"type": "json_object"}},
            "grammar",
            "not both",
        ),
    ],
    ids=["no-schema", "bad-schema", "bad-type", "bad-gbnf", "both"],
)
def test_bad_formats_are_400s_naming_the_problem(client, options, param, message):
    with pytest.raises(openai.BadRequestError) as error:
        _ask(client, **options)
    assert error.value.body["param"] == param and message in error.value.body["message"]


def test_an_over_deep_schema_is_a_400(client):
    schema: dict = {"type": "string"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(openai.BadRequestError, match="deeper than 32"):
        _ask(client, response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}})
