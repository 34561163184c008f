"""The benchmark suite: prompts of every kind people send (bench/suite/suite.yaml), validated on load.

`bench --vs-llama-cpp DIR --suite` runs them all, one cell each, instead of bench's six prompts
(bench/measure.py's PROMPTS, which the default was tuned on); the floor is per prompt, so its table
gives every prompt its own row and names the worst one.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from ..errors import SpecggufError, UsageError

KINDS = ("code", "edit", "prose", "chat", "json", "tools", "summary", "translation", "long")
SUITE_FILE = "suite.yaml"
_KEYS = {"name": str, "kind": str, "prompt": str, "attach": list}
_REQUIRED = ("name", "kind", "prompt")
MAX_ATTACH_BYTES = 1 << 20


class SuiteError(SpecggufError):
    """The suite file is malformed: a typo names its file and line."""


@dataclass(frozen=True)
class SuitePrompt:
    name: str
    kind: str
    text: str  # the prompt with its attachments, as the user message


def load_suite(text: str | None = None, *, source: str = SUITE_FILE, read=None) -> list[SuitePrompt]:
    """The suite's prompts, in file order. `text`/`read` default to the shipped file and its folder
    (tests give their own); `read(name)` returns an attachment's text."""
    folder = resources.files("specgguf").joinpath("bench").joinpath("suite")
    if text is None:
        text = folder.joinpath(SUITE_FILE).read_text(encoding="utf-8")
    if read is None:

        def read(name: str) -> str:
            return folder.joinpath(name).read_text(encoding="utf-8")

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise SuiteError(f"{source}: not YAML: {error}") from None
    if not isinstance(root, yaml.SequenceNode) or not root.value:
        raise SuiteError(f"{source}: expected a list of prompts")
    prompts, names = [], set()
    for node in root.value:
        entry = _entry(node, source)
        where = f"{source}:{node.start_mark.line + 1}"
        if entry["name"] in names:
            raise SuiteError(f"{where}: the name {entry['name']!r} is used twice")
        names.add(entry["name"])
        attached = [_attachment(name, read, where) for name in entry.get("attach", [])]
        prompts.append(SuitePrompt(entry["name"], entry["kind"], "\n\n".join([entry["prompt"], *attached])))
    return prompts


def select(suite: list[SuitePrompt], names: str | None) -> list[SuitePrompt]:
    """The suite's prompts named in `names` (comma-separated prompt names or kinds; None: all), in suite order."""
    if names is None:
        return suite
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    known = {p.name for p in suite} | {p.kind for p in suite}
    unknown = [name for name in wanted if name not in known]
    if unknown or not wanted:
        raise UsageError(
            f"--prompts with --suite takes the suite's prompt names or kinds ({', '.join(KINDS)}), got {names!r}"
        )
    return [p for p in suite if p.name in wanted or p.kind in wanted]


def _entry(node: yaml.Node, source: str) -> dict[str, Any]:
    where = f"{source}:{node.start_mark.line + 1}"
    if not isinstance(node, yaml.MappingNode):
        raise SuiteError(f"{where}: expected a mapping with {', '.join(_REQUIRED)}")
    entry: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key, line = key_node.value, f"{source}:{key_node.start_mark.line + 1}"
        if key not in _KEYS:
            raise SuiteError(f"{line}: unknown key {key!r} (known: {', '.join(_KEYS)})")
        value = yaml.safe_load(yaml.serialize(value_node))
        if not isinstance(value, _KEYS[key]) or (key == "attach" and not all(isinstance(v, str) for v in value)):
            raise SuiteError(f"{line}: {key} must be a {'list of file names' if key == 'attach' else 'text'}")
        if isinstance(value, str) and not value.strip():
            raise SuiteError(f"{line}: {key} is empty")
        entry[key] = value
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise SuiteError(f"{where}: missing {', '.join(missing)}")
    if entry["kind"] not in KINDS:
        raise SuiteError(f"{where}: kind {entry['kind']!r} is not one of {', '.join(KINDS)}")
    return entry


def _attachment(name: str, read, where: str) -> str:
    # Only a plain file name beside the suite file: no path leaves its folder.
    if not name or name != name.strip() or "/" in name or "\\" in name or name.startswith("."):
        raise SuiteError(f"{where}: attach takes file names beside the suite file, got {name!r}")
    try:
        text = read(name)
    except (OSError, UnicodeDecodeError) as error:
        raise SuiteError(f"{where}: cannot read the attachment {name!r}: {error}") from None
    if len(text.encode()) > MAX_ATTACH_BYTES:
        raise SuiteError(f"{where}: the attachment {name!r} is over {MAX_ATTACH_BYTES} bytes")
    return text.rstrip("\n")
