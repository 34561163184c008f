"""A grammar's first compilation, in a child process (grammar.py's `GrammarSpec.compile` starts it).

Why a child: nothing in llguidance bounds how deeply its compiler recurses (once per nested rule
or `$ref`: a chain of about 3,000 GBNF rules overflows an 8 MiB stack, and the process dies of
SIGSEGV), and its GBNF-to-Lark converter is Python that grows with the square of a chain's length
(9,000 rules: about a minute, holding the interpreter). A child can be given a deadline, a memory
cap and a small stack, and killed: a crash or an overrun there is the grammar's fault (a 400, one
error line), never the server's. A fresh interpreter (`python -m specgguf.grammar_check`, about
0.15 s), never a fork of a process that runs llama.cpp's threads; grammar.py caches the verdicts.

The check, on a thread of `CHECK_STACK_BYTES` (half the 2 MiB a thread gets where the stack size is
unlimited, so a grammar that compiles here also compiles on the verifier's side, on any thread):
the text becomes llguidance's grammar and validates; a matcher over a byte vocabulary starts and
computes its first mask (a grammar nothing can satisfy, `root ::= root` or a `$ref` cycle, stops
there); it takes the text the grammar forces from there (a forced run too long to follow,
`"a"{100000}`, fails) and computes the next mask (a dead end right after it stops there).

Imports nothing of specgguf's but the package (numpy and llama.cpp stay out of the child).
"""

from __future__ import annotations

import json
import math
import re
import resource
import sys
import threading
from functools import lru_cache
from typing import Any

from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper, grammar_from

CHECK_STACK_BYTES = 1 << 20
MEMORY_BYTES = 4 << 30  # address space; a check that wants more is a grammar too large to follow
Verdict = tuple[
    str, str
]  # ("ok", llguidance's grammar) or (a problem: "invalid", "unsatisfiable", "too large", its text)


class _Bytes:
    """A vocabulary of the 256 bytes, any token ids the grammar names (`<[151657]>`: a tool call's
    opener, special tokens of the real vocabulary), and an end token: what any tokenizer can spell."""

    bos_token_id = None

    def __init__(self, n_named: int = 0):
        self.eos_token_id = max(256, n_named)
        self.tokens = [bytes([value]) for value in range(256)]
        self.tokens += [b"\xff<token %d>" % token for token in range(256, self.eos_token_id)] + [b"\xff<end>"]
        self.special_token_ids = list(range(256, self.eos_token_id + 1))

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_TOKEN_REF = re.compile(r"<\[([0-9,\-\s]+)\]>")  # a token reference: `<[151657]>`, `<[1,2]>`, `<[5-9]>`


def _compact(kind: str, text: str) -> str:
    """A GBNF or Lark grammar with the tokens it names one at a time renumbered from 256, in order
    (`<[151657]>` → `<[256]>`): to the check a token is a token, and a byte vocabulary reaching 151657 (a
    tool call's opener) took a fifth of a second to build, per grammar. Where it names a list or a
    range of tokens, or a byte's id, or is another kind, the text as it is."""
    refs = _TOKEN_REF.findall(text) if kind in ("gbnf", "lark") else []
    if not refs or not all(ref.strip().isdigit() and int(ref) >= 256 for ref in refs):
        return text
    renumbered = {int(ref): 256 + index for index, ref in enumerate(dict.fromkeys(int(ref) for ref in refs))}
    return _TOKEN_REF.sub(lambda match: f"<[{renumbered[int(match.group(1))]}]>", text)


def _named_tokens(text: str) -> int:
    """One past the largest token id the grammar names in a `<[...]>` token reference (0: none)."""
    ids = [int(number) for ref in _TOKEN_REF.findall(text) for number in re.findall(r"\d+", ref)]
    return max(ids) + 1 if ids else 0


@lru_cache(maxsize=4)
def _tokenizer(n_named: int) -> LLTokenizer:
    """The byte vocabulary with `n_named` token ids (built once per child however many grammars it
    checks: `_compact` keeps a tool call's `<[151657]>` from making 151k of them)."""
    return LLTokenizer(TokenizerWrapper(_Bytes(n_named)))


def dead_end(error: str) -> bool:
    """Whether a matcher's error says that no text can come next, and it cannot end there."""
    return error.partition("\n")[0].strip() in ("NoExtension", "NoExtensionBias")


def to_llguidance(kind: str, text: str, json_options: Any) -> str:
    """The text as llguidance's grammar (a `grammar.GrammarKind`; raises ValueError and the like)."""
    if kind in ("json_object", "json_schema"):
        schema = json.loads(text) if kind == "json_schema" else {"type": "object"}
        return LLMatcher.grammar_from_json_schema(schema, overrides=json_options)
    return grammar_from("regex" if kind == "regex" else "lark" if kind == "lark" else "gbnf", text)


def check(kind: str, text: str, json_options: Any) -> Verdict:
    try:
        grammar = to_llguidance(kind, text, json_options)
        compact = _compact(kind, text)
        checked = grammar if compact == text else to_llguidance(kind, compact, json_options)
    except Exception as error:  # noqa: BLE001 - a schema's JSON, a GBNF that does not convert: its message
        return "invalid", str(error) or type(error).__name__
    problem = LLMatcher.validate_grammar(checked)
    if problem:
        return "invalid", problem
    matcher = LLMatcher(_tokenizer(_named_tokens(compact)), checked, log_level=0)
    if matcher.is_error():
        return "invalid", matcher.get_error()
    for _ in range(2):  # at the start, and after the text it forces from there
        matcher.compute_bitmask()
        if matcher.is_error():
            stuck = dead_end(matcher.get_error())
            return ("unsatisfiable", "no text matches it") if stuck else ("too large", matcher.get_error())
        forced = matcher.compute_ff_tokens()
        if forced and not matcher.consume_tokens(forced):
            return "too large", matcher.get_error().removeprefix("parser error: ")
    return "ok", grammar


def _limit(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or soft > value:
        resource.setrlimit(which, (value, hard))


def main() -> None:
    """The child: a request ({"kind", "text", "json_options", "seconds"}) on stdin, `check`'s verdict,
    on a small stack, as JSON on stdout; or several (`"checks": [[kind, text], ...]` for "kind" and
    "text": a request's tools, checked in one child), their verdicts as a list. Its own limits: no
    core file (a crash writes nothing into the server's folder), `MEMORY_BYTES` of memory, and the
    parent's deadline in CPU time (the kernel ends it even if the parent is gone)."""
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_AS, MEMORY_BYTES)
    request = json.loads(sys.stdin.buffer.read())
    _limit(resource.RLIMIT_CPU, math.ceil(request["seconds"]) + 1)
    checks = request.get("checks", [[request.get("kind"), request.get("text")]])
    verdicts: list[Verdict] = []
    threading.stack_size(CHECK_STACK_BYTES)
    thread = threading.Thread(
        target=lambda: verdicts.extend(check(kind, text, request["json_options"]) for kind, text in checks)
    )
    thread.start()
    thread.join()
    if "checks" in request:
        answer: Any = verdicts if len(verdicts) == len(checks) else None  # (the parent checks them alone)
    else:
        answer = verdicts[0] if verdicts else ("too large", "the compiler failed")
    sys.stdout.buffer.write(json.dumps(answer).encode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    main()
