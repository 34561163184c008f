"""Grammars for constrained decoding: JSON schemas, `json_object`, GBNF (llama.cpp's), Lark and regular
expressions, compiled by llguidance and served to the engine as a `core.constraint.Constraint`.

Why llguidance: a maintained library (Microsoft's guidance; llama.cpp, vLLM and SGLang ship it) with
abi3 CPU wheels, lazy Earley parsing that computes a token mask in well under a millisecond on a
150k-token vocabulary (scripts/grammar_mask_cost.py measures it), cheap rollback (`LLMatcher.rollback`,
which drafting needs), forced tokens (`compute_ff_tokens`: free drafts) and JSON-schema, GBNF and Lark
front ends in one. `GrammarSpec.compile` checks a grammar without a model (the server's 400s), the
first time in a child process with a deadline (grammar_check.py says why), then from a cache by the
grammar's hash; `constraint_for` binds it to the verifier's vocabulary (llama/guidance.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from . import grammar_check
from .core.constraint import Constraint
from .core.json_digits import Bounds, DigitBound
from .errors import SpecggufError, UsageError, terminal_safe
from .files.small_files import FileRefused, loads, read_small

GrammarKind = Literal["json_object", "json_schema", "gbnf", "lark", "regex"]
GRAMMAR_KINDS: dict[GrammarKind, str] = {
    "json_object": "any JSON object",
    "json_schema": "JSON that validates against a JSON schema",
    "gbnf": "a llama.cpp GBNF grammar (Lark syntax works too)",
    "lark": "a Lark grammar (llguidance's syntax)",
    "regex": "text that matches a regular expression",
}
# Where JSON allows whitespace, the model writes its own (on one line, or pretty-printed): a grammar
# masks what the schema forbids, it does not choose a spelling (forcing `{"a":1}` on a model that
# writes `{"a": 1}` pushes it off its own distribution, values included). Bounded as llama.cpp's
# schema converter bounds it (`| " " | "\n"{1,2} [ \t]{0,20}`), so a model cannot wander off into
# whitespace: at one place nothing, one space, or one or two line breaks and an indent of up to 20.
WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"
# llguidance's JSON options (its docs/json_schema.md); oneOf is read as anyOf, as vLLM does, rather
# than refusing the schemas (pydantic's unions) whose branches it cannot prove disjoint.
JSON_OPTIONS: Any = {"whitespace_pattern": WHITESPACE, "coerce_one_of": True}
# A JSON integer's digits, bounded as llama.cpp's schema converter bounds them (16): without a bound a
# model that starts `"age": 25000…` can write digits until max_tokens. Given as the range it spans
# (`bound_integers`), which llguidance turns into an exact regex; a schema's own wider bound stands.
MAX_INTEGER = 10**16 - 1
MAX_SCHEMA_DEPTH = 32  # nested objects/arrays in a schema; deeper is refused (it would be a DoS, not a use)
MAX_GRAMMAR_CHARS = 256 * 1024
COMPILE_SECONDS = 5.0  # a first compilation's deadline (an ordinary grammar takes milliseconds)
MAX_CACHED = 128  # compiled grammars (and refusals) kept by hash
# First compilations running at once (each a child process that may take a core and MEMORY_BYTES for
# COMPILE_SECONDS; an ordinary grammar's takes about 0.2 s): one more is GrammarBusy, which the
# server answers 503 with Retry-After, so slow checks hold at most this many of its threads.
MAX_CHECKS = 2


class GrammarError(SpecggufError):
    """A grammar or JSON schema that cannot be compiled; the message names the problem."""

    exit_code = 2


class GrammarBusy(SpecggufError):
    """MAX_CHECKS grammars are being checked already: nothing is wrong with this one, try again shortly."""


def schema_depth(value: Any, depth: int = 0) -> int:
    """How deeply a JSON value nests (objects and arrays)."""
    if depth > MAX_SCHEMA_DEPTH:
        return depth
    if isinstance(value, dict):
        return max((schema_depth(v, depth + 1) for v in value.values()), default=depth + 1)
    if isinstance(value, list):
        return max((schema_depth(v, depth + 1) for v in value), default=depth + 1)
    return depth


def check_schema(schema: Any, what: str = "the JSON schema") -> dict:
    """A schema as a dict, refused (GrammarError naming it) if it is not an object or nests too deep."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object, not {type(schema).__name__}")
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    return schema


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("const", "enum", "default", "examples")  # JSON values, not schemas: left as they are


def bound_integers(schema: Any) -> Any:
    """The schema with every integer (`"type": "integer"`, alone or beside "null", "string"…) that
    sets no minimum (maximum) given -MAX_INTEGER (MAX_INTEGER): at most 16 digits. A type that
    allows "number" too is left alone (llguidance's bounded numbers have no exponent, `1e-5`): its
    digits are bounded over the masks instead (constraint_for, core/json_digits.py)."""
    if isinstance(schema, list):
        return [bound_integers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            bounded[key] = {name: bound_integers(sub) for name, sub in value.items()}
        else:
            bounded[key] = value if key in _SCHEMA_VALUES else bound_integers(value)
    kinds = bounded.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if "integer" in kinds and "number" not in kinds:
        if "minimum" not in bounded and "exclusiveMinimum" not in bounded:
            bounded["minimum"] = -MAX_INTEGER
        if "maximum" not in bounded and "exclusiveMaximum" not in bounded:
            bounded["maximum"] = MAX_INTEGER
    return bounded


@dataclass(frozen=True)
class GrammarSpec:
    """What the answer must follow: a kind and its text (a schema as JSON text, or the grammar)."""

    kind: GrammarKind
    text: str = ""

    @classmethod
    def json_schema(cls, schema: Any, what: str = "the JSON schema") -> GrammarSpec:
        return cls("json_schema", json.dumps(bound_integers(check_schema(schema, what))))

    def compile(self) -> str:
        """llguidance's grammar, checked (no model needed); GrammarError says what is wrong."""
        self._check_text()
        verdict, detail = _compiled(self.kind, self.text)
        if verdict == "ok":
            return detail
        if verdict == "unsatisfiable":
            raise GrammarError(f"nothing can satisfy the {self.kind}: {detail}")
        if verdict == "too large":
            raise GrammarError(f"the {self.kind} is too large or too deeply nested to follow: {_first_line(detail)}")
        raise GrammarError(f"the {self.kind} is not valid: {_first_line(detail)}")

    def _check_text(self) -> None:
        """What is refused before any compiler sees it (GrammarError): the size, a schema that is not JSON."""
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the {self.kind} is over {MAX_GRAMMAR_CHARS // 1024} KiB")
        if self.kind == "json_schema":
            try:
                check_schema(json.loads(self.text))
            except (ValueError, TypeError, RecursionError) as error:
                raise GrammarError(f"the {self.kind} is not valid: {_first_line(error)}") from None


def check_together(specs: Sequence[GrammarSpec]) -> None:
    """The first compilations of several grammars (a request's tools: a schema each, a call grammar
    per form) in one child instead of one each (a child's start, and a call grammar's vocabulary, cost
    a tenth to a third of a second). Their verdicts go into the cache, where each `compile` finds its
    own. Best effort: where the batch cannot run (MAX_CHECKS busy) or fails (its deadline, a crash),
    each grammar is checked alone by its `compile`, as without it."""
    global _checking
    pending: dict[str, GrammarSpec] = {}
    for spec in specs:
        with contextlib.suppress(GrammarError):  # (its compile says why)
            spec._check_text()
            with _cache_lock:
                if (key := _key(spec.kind, spec.text)) not in _cache:
                    pending[key] = spec
    with _cache_lock:
        if len(pending) < 2 or _checking >= MAX_CHECKS:
            return
        _checking += 1
    try:
        checks = [[spec.kind, spec.text] for spec in pending.values()]
        answer = _ask_child({"checks": checks, "json_options": JSON_OPTIONS, "seconds": COMPILE_SECONDS})
    finally:
        with _cache_lock:
            _checking -= 1
    if isinstance(answer, list) and len(answer) == len(pending):
        for key, (verdict, detail) in zip(pending, answer):
            _remember(key, (str(verdict), str(detail)))


def _key(kind: GrammarKind, text: str) -> str:
    return hashlib.sha256(json.dumps([kind, text, JSON_OPTIONS]).encode("utf-8", "surrogatepass")).hexdigest()


_cache: OrderedDict[str, grammar_check.Verdict] = OrderedDict()
_cache_lock = threading.Lock()  # guards _cache and _checking
_checking = 0  # first compilations running now (at most MAX_CHECKS)


def _compiled(kind: GrammarKind, text: str) -> grammar_check.Verdict:
    """The verdict on a grammar: from the cache, else from a child process (`grammar_check`) when
    fewer than MAX_CHECKS run (else GrammarBusy)."""
    global _checking
    key = _key(kind, text)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        if _checking >= MAX_CHECKS:
            raise GrammarBusy(f"{_checking} grammars are being checked already")
        _checking += 1
    try:
        verdict = _in_child(kind, text)
    finally:
        with _cache_lock:
            _checking -= 1
    _remember(key, verdict)
    return verdict


def _remember(key: str, verdict: grammar_check.Verdict) -> None:
    with _cache_lock:
        _cache[key] = verdict
        while len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)


def _in_child(kind: GrammarKind, text: str) -> grammar_check.Verdict:
    """`grammar_check.check` in a child process (python -m specgguf.grammar_check), given
    `COMPILE_SECONDS`; killed past them."""
    verdict, detail = _ask_child({"kind": kind, "text": text, "json_options": JSON_OPTIONS, "seconds": COMPILE_SECONDS})
    return str(verdict), str(detail)


def _ask_child(request: dict[str, Any]) -> Any:
    """The child's answer to `request` (its JSON); where it gave none, a verdict saying why."""
    child = subprocess.Popen(
        [sys.executable, "-m", "specgguf.grammar_check"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a Rust panic's or stack overflow's message is not the user's
        start_new_session=True,  # a Ctrl-C is this process's to handle
    )
    try:
        answer, _ = child.communicate(json.dumps(request).encode("utf-8", "surrogatepass"), timeout=COMPILE_SECONDS)
    except subprocess.TimeoutExpired:
        return "too large", f"it did not compile within {COMPILE_SECONDS:g} s"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    try:
        return json.loads(answer)
    except ValueError:  # it died before answering
        code = child.returncode
    if code >= 0:  # not killed by the grammar (a stack overflow, its memory or CPU time): it could not run
        raise SpecggufError(f"the grammar checker (python -m specgguf.grammar_check) failed, exit status {code}")
    how = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    return "too large", f"compiling it stopped the compiler ({how})"


def _first_line(error: object) -> str:
    return terminal_safe((str(error).strip().splitlines() or [type(error).__name__])[0][:300])


def _dead_end(error: str) -> str | None:
    """Why the grammar cannot go on, in words, where the matcher's error is a dead end; None for others.
    llguidance stops computing the text a grammar forces past a limit of parser items ("Too many items
    (limit 50000; ff_tokens)"): forced text that never ends (`rule ::= "c" rule`), or one too long to follow."""
    if grammar_check.dead_end(error):
        return "no text can follow the answer so far"
    if "Too many items" in error and "ff_tokens" in error:
        return "a dead end, where the text it forces never ends (or is too long to follow), so no answer can end"
    return None


class GuidanceConstraint:
    """`core.constraint.Constraint` over an llguidance matcher for one answer."""

    def __init__(self, tokenizer: LLTokenizer, grammar: str, n_vocab: int):
        self.matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar cannot be used: {_first_line(self.matcher.get_error())}")
        self.n_vocab = n_vocab
        self._words = (tokenizer.vocab_size + 31) // 32
        self._bits = np.zeros(self._words, dtype=np.int32)
        self._eos = np.zeros(n_vocab, dtype=bool)
        self._eos[[t for t in tokenizer.eos_tokens if t < n_vocab]] = True
        self._past_end = 0  # tokens advanced after the grammar stopped (an end token and what follows)

    def allowed(self) -> np.ndarray:
        if self._past_end or self.matcher.is_stopped():
            return self._eos
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        # A dead end (a rule nothing satisfies, behind a choice) or one of llguidance's limits. Also when
        # a draft led here: the matcher cannot leave an error state (not even by rollback), and an
        # end-only mask would end the answer as if it were complete.
        if self.matcher.is_error():
            error = self.matcher.get_error()
            raise GrammarError(f"the grammar cannot go on: {_dead_end(error) or _first_line(error)}")
        mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little").astype(bool)
        return mask[: self.n_vocab] if len(mask) >= self.n_vocab else np.pad(mask, (0, self.n_vocab - len(mask)))

    def advance(self, token: int) -> None:
        if self._past_end or self.matcher.is_stopped():
            self._past_end += 1
            return
        if not self.matcher.consume_token(token):
            error = self.matcher.get_error()
            if why := _dead_end(error):  # found on the way (forced text is computed as a token is taken)
                raise GrammarError(f"the grammar cannot go on: {why}")
            raise GrammarError(f"the grammar refused token {token}: {_first_line(error)}")

    def rollback(self, n_tokens: int) -> None:
        beyond = min(n_tokens, self._past_end)
        self._past_end -= beyond
        if n_tokens > beyond and not self.matcher.rollback(n_tokens - beyond):
            raise GrammarError(f"the grammar could not roll back: {_first_line(self.matcher.get_error())}")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        if self._past_end or self.matcher.is_stopped():
            return 0
        return self.matcher.validate_tokens(list(tokens))

    def forced(self) -> list[int]:
        if self._past_end or self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()


def grammar_from_files(*, json_schema: Path | None, grammar: Path | None) -> GrammarSpec | None:
    """`run --json-schema FILE` / `--grammar FILE`: the grammar, read and checked (one of them at most)."""
    if json_schema is not None and grammar is not None:
        raise UsageError("give --json-schema or --grammar, not both")
    path = json_schema or grammar
    if path is None:
        return None
    option = "--json-schema" if json_schema is not None else "--grammar"
    try:
        text = read_small(path, max_bytes=MAX_GRAMMAR_CHARS).decode("utf-8")
    except FileRefused as refused:  # a FIFO or /dev/zero would block or never end
        raise UsageError(f"{option}: {terminal_safe(str(path))} is {refused}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{option}: cannot read {terminal_safe(str(path))}: {_first_line(error)}") from None
    if json_schema is not None:
        try:
            spec = GrammarSpec.json_schema(loads(text), f"{option} {terminal_safe(path.name)}")
        except ValueError as error:
            raise GrammarError(f"{option}: {terminal_safe(path.name)} is not JSON: {error}") from None
    else:
        spec = GrammarSpec("gbnf", text)
    spec.compile()
    return spec


def constraint_for(verifier: Any, spec: GrammarSpec) -> Constraint:
    """The grammar bound to the verifier's vocabulary (a `llama.model.LlamaModel`); a JSON schema's
    numbers bounded in digits (core/json_digits.py)."""
    from .llama.guidance import guidance_tokenizer, token_texts  # llama.cpp loads only when a grammar is used

    constraint = GuidanceConstraint(guidance_tokenizer(verifier), spec.compile(), verifier.n_vocab)
    if spec.kind != "json_schema":
        return constraint
    return DigitBound(constraint, token_texts(verifier), number_bounds(json.loads(spec.text)))


def number_bounds(schema: Any) -> Bounds:
    """The digit bounds for a schema's numbers: an integral part unbounded where the schema gives a
    numeric bound past MAX_INTEGER (its own wider bound stands, as `bound_integers` lets it)."""
    return Bounds(integral=None if _wider(schema) else len(str(MAX_INTEGER)))


def _wider(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_wider(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in _BOUNDS and isinstance(value, int | float) and abs(value) > MAX_INTEGER:
            return True
        if key not in _SCHEMA_VALUES and _wider(value):
            return True
    return False


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
