"""Domain errors. Raised deep, shown to users once, at the CLI edge, as one line."""

from __future__ import annotations

import os


def debug_enabled() -> bool:
    """SPECGGUF_DEBUG set (and not 0): tracebacks instead of one line, and llama.cpp's own log."""
    return os.environ.get("SPECGGUF_DEBUG") not in (None, "", "0")


class SpecggufError(Exception):
    """Base class: its message is what the user sees, so it must say what to do."""

    exit_code = 1


class UsageError(SpecggufError):
    """Bad option values or arguments."""

    exit_code = 2


class PromptError(SpecggufError):
    """An empty or unusable prompt."""

    exit_code = 2


class ModelLoadError(SpecggufError):
    """A model file is missing, not a GGUF, truncated, or llama.cpp refused it."""


class IncompatibleModelsError(SpecggufError):
    """The draft cannot be paired with the verifier; the message says why."""


class DecodeError(SpecggufError):
    """llama.cpp failed while evaluating tokens of a model that had loaded."""


class CheckCouldNotRun(SpecggufError):
    """`check` could not read one side (a missing file, ...): exit status 2, as 1 means "cannot be paired"."""

    exit_code = 2


class Cancelled(SpecggufError):
    """A request stopped between two chunks of a model call (serve: its client hung up); each model's
    cache holds the chunks evaluated before it, whole (llama.runtime.stops_when)."""


class ContextFullError(SpecggufError):
    """The prompt does not fit in the context window."""


class AssetError(SpecggufError):
    """A model could not be assembled or downloaded (missing package, bad checksum, ...)."""


class HubUnreachableError(AssetError):
    """The Hugging Face hub (or HF_ENDPOINT) could not be reached, or offline mode forbids it."""


def terminal_safe(text: str) -> str:
    """Text from a file or the network, safe to print on one line: control and format characters
    (escape sequences, bidi overrides, newlines) become visible escapes such as `\\x1b`."""
    if text.isprintable():  # Python's "printable": no Other (C*) or Separator (Z*) character but the space
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
