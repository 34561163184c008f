"""OpenAI's own schemas for the bodies the server sends and the requests it takes, kept in
tests/data/openai_schemas.json (from github.com/openai/openai-openapi, descriptions left out),
checked with `jsonschema`."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from referencing import Registry, Resource

DOCUMENT = Path(__file__).parent / "data" / "openai_schemas.json"


def _nullable(node):
    """The document still marks some fields OpenAPI 3.0's way (`nullable: true`), which JSON Schema
    does not read: such a schema becomes `anyOf: [itself, null]`, as the API means it."""
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _nullable(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def _registry() -> Registry:
    document = _nullable(json.loads(DOCUMENT.read_text()))
    return Registry().with_resource("openai.json", Resource.from_contents(document, default_specification=_spec()))


def _spec():
    from referencing.jsonschema import DRAFT202012

    return DRAFT202012


def errors(body, schema: str) -> list[str]:
    """Where `body` breaks components.schemas[schema] (empty: it conforms)."""
    validator = Draft202012Validator({"$ref": f"openai.json#/components/schemas/{schema}"}, registry=_registry())
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(body)]


def assert_conforms(body, schema: str) -> None:
    found = errors(body, schema)
    assert not found, f"{schema}: {found[:5]}"
