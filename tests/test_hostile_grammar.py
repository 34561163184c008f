"""Hostile grammars (issue 36): a grammar's first compilation runs in a child process with a deadline
(grammar_check.py), so a chain of thousands of rules is one error line for `run` and a 400 for the
server, which answers everyone else meanwhile; a grammar nothing can satisfy, or one too large to
follow, is refused by name instead of answering "" or failing with llguidance's internals."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections import OrderedDict

import httpx
import numpy as np
import pytest

from live_server import live_server
from specgguf import grammar, grammar_check
from specgguf.errors import SpecggufError
from specgguf.grammar import (
    COMPILE_SECONDS,
    MAX_CHECKS,
    MAX_GRAMMAR_CHARS,
    GrammarBusy,
    GrammarError,
    GrammarSpec,
    constraint_for,
)
from specgguf.llama.model import LlamaModel
from specgguf.serve.jobs import failure
from specgguf.serve.messages import Failed

CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}  # a schema that refers only to itself


def chained_rules(n: int) -> str:
    """GBNF whose rules each refer to the next: the issue's 9,000-rule grammar is 226 KiB."""
    return "root ::= r0\n" + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "y"\n'


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_chain_of_thousands_of_rules_is_refused_in_bounded_time(monkeypatch):
    children = []
    in_child = grammar._in_child
    monkeypatch.setattr(grammar, "_in_child", lambda *args: children.append(args) or in_child(*args))
    spec = GrammarSpec("gbnf", chained_rules(3000))
    started = time.monotonic()
    with pytest.raises(GrammarError, match="the gbnf is too large or too deeply nested to follow"):
        spec.compile()  # it crashed this process (SIGSEGV), or took ~50 s holding the interpreter
    assert time.monotonic() - started < COMPILE_SECONDS + 5
    with pytest.raises(GrammarError, match="too deeply nested"):
        spec.compile()  # the verdict is cached by the grammar's hash: no second child
    assert len(children) == 1


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_checker_that_cannot_run_is_no_verdict_on_the_grammar(monkeypatch):
    monkeypatch.setattr(sys, "executable", shutil.which("false") or "/bin/false")
    spec = GrammarSpec("gbnf", 'root ::= "never cached"')
    with pytest.raises(SpecggufError, match="the grammar checker .* failed, exit status 1") as raised:
        spec.compile()
    assert not isinstance(raised.value, GrammarError)  # the server's fault (a 500), not a 400
    monkeypatch.undo()
    assert spec.compile()  # and nothing was cached


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_requests_grammars_are_checked_in_one_child_with_the_verdicts_each_gets_alone(monkeypatch):
    """A request's tools (a schema each) are first compiled together, in one child: its start and the
    call grammar's vocabulary were a tenth to a third of a second per grammar on an agent's first turn.
    Each grammar's verdict is the one it gets alone, a refusal included, and compile reads it."""
    marker = f"together {time.monotonic_ns()}"  # grammars no other test has cached
    specs = [
        GrammarSpec.json_schema({"type": "object", "properties": {"a": {"const": marker}}}),
        GrammarSpec("gbnf", f'root ::= "{marker}"'),
        GrammarSpec.json_schema({**CYCLE, "description": marker}),  # nothing satisfies it
        GrammarSpec("gbnf", "x" * (MAX_GRAMMAR_CHARS + 1)),  # refused before any child: left out
    ]
    requests: list[dict] = []
    ask = grammar._ask_child
    monkeypatch.setattr(grammar, "_ask_child", lambda request: requests.append(request) or ask(request))
    grammar.check_together(specs)
    assert [len(request["checks"]) for request in requests] == [3]
    together = [_outcome(spec) for spec in specs]
    assert len(requests) == 1  # compile found every verdict in the cache
    assert together[2].startswith("GrammarError: nothing can satisfy") and together[3].startswith("GrammarError")
    monkeypatch.setattr(grammar, "_cache", OrderedDict())
    assert [_outcome(spec) for spec in specs] == together  # alone, one child each: the same verdicts
    assert len(requests) == 1 + 3


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_batch_that_fails_leaves_each_grammar_to_be_checked_alone(monkeypatch):
    """A batch whose child gives no list (its deadline passed, the compiler crashed on one grammar)
    caches nothing: each grammar is then checked alone, and only the bad one is refused."""
    marker = f"failing batch {time.monotonic_ns()}"
    good, bad = GrammarSpec("gbnf", f'root ::= "{marker}"'), GrammarSpec("gbnf", chained_rules(3000) + f"# {marker}\n")
    grammar.check_together([good, bad])  # the chain overflows the child's stack: no verdicts at all
    with grammar._cache_lock:
        assert grammar._key(good.kind, good.text) not in grammar._cache
    assert good.compile()
    with pytest.raises(GrammarError, match="too deeply nested"):
        bad.compile()


def test_the_check_renumbers_the_tokens_a_call_grammar_names_and_keeps_the_grammar():
    """A tool call's grammar names its opener's token (`<[151657]>`): the check renumbers it (a byte
    vocabulary reaching 151657 took a fifth of a second to build) and returns the grammar as written."""
    call = 'start: <[151657]> "{" NAME "}" <[151658]>\nNAME: /[a-z]+/\n'
    assert grammar_check._compact("lark", call) == 'start: <[256]> "{" NAME "}" <[257]>\nNAME: /[a-z]+/\n'
    verdict, checked = grammar_check.check("lark", call, grammar.JSON_OPTIONS)
    assert verdict == "ok" and checked == grammar_check.to_llguidance("lark", call, grammar.JSON_OPTIONS)
    assert "151657" in checked
    for kept in ("start: <[151657-151660]>\n", "start: <[5]> <[151657]>\n"):  # a range, a byte's id
        assert grammar_check._compact("lark", kept) == kept
    assert grammar_check._compact("json_schema", '{"const": "<[151657]>"}') == '{"const": "<[151657]>"}'
    stuck = 'start: <[151657]> a\na: a "x"\n'  # nothing satisfies it, renumbered or not
    assert grammar_check.check("lark", stuck, grammar.JSON_OPTIONS)[0] == "unsatisfiable"
    assert (
        grammar_check.check("lark", grammar_check._compact("lark", stuck), grammar.JSON_OPTIONS)[0] == "unsatisfiable"
    )


def _outcome(spec: GrammarSpec) -> str:
    try:
        return spec.compile()
    except GrammarError as error:
        return f"GrammarError: {error}"


def test_ordinary_grammars_still_compile_and_a_moderate_chain_runs_on_the_verifier(tiny_verifier):
    assert len(chained_rules(9000)) < MAX_GRAMMAR_CHARS  # the size cap alone did not bound it
    verifier = LlamaModel(tiny_verifier, n_ctx=256)
    for spec in (
        GrammarSpec("gbnf", chained_rules(200)),
        GrammarSpec("gbnf", 'root ::= "a"{1000}'),
        GrammarSpec.json_schema({"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": {"$ref": "#"}}}}),
    ):
        constraint = constraint_for(verifier, spec)  # on this thread's stack: what passed the check fits here
        assert constraint.allowed().any()


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_grammar_that_names_token_ids_passes_the_check():
    """Tool calls open with a special token named by id (`<[151657]>`, Qwen's <tool_call>): the
    check's byte vocabulary holds every id the grammar names (it was 'Token range end too large')."""
    lark = '%llguidance {}\nstart: <[151657]> "{" /[a-z]+/ "}" <[151658]>\n'
    assert GrammarSpec("lark", lark).compile()
    with pytest.raises(GrammarError, match="nothing can satisfy"):
        GrammarSpec("lark", "%llguidance {}\nstart: <[151657]> rule\nrule: rule\n").compile()


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec("gbnf", "root ::= root"),
        GrammarSpec("gbnf", "root ::= rule\nrule ::= rule"),
        GrammarSpec("gbnf", 'root ::= "answer: " rule\nrule ::= rule'),  # a dead end right after forced text
        GrammarSpec.json_schema(CYCLE),
    ],
)
@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_grammar_nothing_can_satisfy_is_refused(spec):
    with pytest.raises(GrammarError, match=f"nothing can satisfy the {spec.kind}: no text matches it"):
        spec.compile()  # it answered "" with finish_reason "stop"


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_grammar_too_large_to_follow_is_refused_by_name():
    with pytest.raises(GrammarError, match="the gbnf is too large or too deeply nested to follow: Too many items"):
        GrammarSpec("gbnf", 'root ::= "a"{100000}').compile()  # a 500 with llguidance's state dump


def test_a_dead_end_found_while_generating_is_a_grammar_error(tiny_verifier):
    """A dead end behind a choice passes the check; the constraint says so instead of ending the answer."""
    verifier = LlamaModel(tiny_verifier, n_ctx=256)
    constraint = constraint_for(verifier, GrammarSpec("gbnf", "root ::= [ab] rule\nrule ::= rule"))
    allowed = np.flatnonzero(constraint.allowed())
    assert {verifier.token_bytes(int(token)) for token in allowed} <= {b"a", b"b"}
    constraint.advance(int(allowed[0]))
    with pytest.raises(GrammarError, match="the grammar cannot go on: no text can follow the answer so far"):
        constraint.allowed()  # it allowed only the end tokens: a "stop" for an answer the grammar refuses


ENDLESS = 'root ::= [ab] rule\nrule ::= "c" rule'  # after a choice, forced text that never ends


@pytest.mark.parametrize("gbnf", [ENDLESS, 'root ::= [ab] "c"{60000}'])
def test_forced_text_past_llguidances_limit_is_a_dead_end_in_words(tiny_verifier, gbnf):
    """Both pass the check (a choice comes first); past it, llguidance computes the forced text and gives
    up at its item limit. That was "the grammar refused token 262: parser error: Too many items (limit
    50000; ff_tokens); try avoiding single-byte/short lexemes"."""
    verifier = LlamaModel(tiny_verifier, n_ctx=256)
    constraint = constraint_for(verifier, GrammarSpec("gbnf", gbnf))
    constraint.advance(int(np.flatnonzero(constraint.allowed())[0]))
    forced = constraint.forced()
    with pytest.raises(GrammarError) as raised:
        constraint.advance(forced[0])
    assert str(raised.value) == (
        "the grammar cannot go on: a dead end, where the text it forces never ends (or is too long to follow),"
        " so no answer can end"
    )


def test_run_at_a_grammar_dead_end_says_so_in_words(cli, tiny_verifier, tmp_path):
    path = tmp_path / "endless.gbnf"
    path.write_text(ENDLESS)
    line = cli("run", "-m", tiny_verifier, "-n", "20", "--grammar", path, "the cat").error_line()
    assert line == (
        "specgguf: error: the grammar cannot go on: a dead end, where the text it forces never ends (or is too"
        " long to follow), so no answer can end"
    )


def test_run_with_a_9000_rule_grammar_is_one_error_line(cli, tmp_path):
    path = tmp_path / "chain.gbnf"
    path.write_text(chained_rules(9000))
    started = time.monotonic()
    result = cli.process("run", "-m", tmp_path / "missing.gguf", "--grammar", path, "hi", timeout=COMPILE_SECONDS + 60)
    assert "too large or too deeply nested" in result.error_line()  # no output after 240 s
    assert result.returncode == 2
    assert time.monotonic() - started < COMPILE_SECONDS + 30


def test_a_grammar_check_past_the_cap_is_refused_at_once_and_its_place_is_free_after(monkeypatch):
    """A first compilation beyond MAX_CHECKS running ones is GrammarBusy at once (not a 400: nothing is
    wrong with the grammar); as the worker plans a tool call's grammar it is a 503 with Retry-After."""
    release = threading.Event()
    monkeypatch.setattr(grammar, "_cache", OrderedDict())  # (its made-up verdicts stay here)
    monkeypatch.setattr(grammar, "_in_child", lambda kind, text: release.wait(30) and ("ok", text))
    checks = [threading.Thread(target=GrammarSpec("regex", f"slow{index}").compile) for index in range(MAX_CHECKS)]
    for check in checks:
        check.start()
    while grammar._checking < MAX_CHECKS:
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(GrammarBusy, match=f"{MAX_CHECKS} grammars are being checked already"):
        GrammarSpec("regex", "one more").compile()
    assert time.monotonic() - started < 1.0
    refused = failure(Failed(GrammarBusy("busy"), status=503))
    assert (refused.status, refused.code, refused.headers) == (503, "grammar_checks_busy", {"Retry-After": "1"})
    release.set()
    for check in checks:
        check.join(30)
    assert grammar._checking == 0
    assert GrammarSpec("regex", "one more").compile() == "one more"  # its turn now


@pytest.fixture(scope="module")
def server(tiny_verifier):
    with live_server("-m", tiny_verifier, "-c", "256", "-t", "1", "-n", "8") as live:
        yield live


def _chat(http: httpx.Client, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **body})


def test_the_server_answers_health_while_a_9000_rule_grammar_is_refused(server):
    slowest, answers = 0.0, []
    with server.http() as http:
        hostile = threading.Thread(target=lambda: answers.append(_chat(http, grammar=chained_rules(9000))))
        hostile.start()
        while hostile.is_alive():
            started = time.monotonic()
            assert http.get("/health", timeout=10).status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.1)
        hostile.join()
        assert slowest < 2.0  # /health was blocked for minutes, then the server died of SIGSEGV
        assert answers[0].status_code == 400
        assert "too large or too deeply nested" in answers[0].json()["error"]["message"]
        assert _chat(http, grammar='root ::= "ok"').json()["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize(
    "body, message",
    [
        ({"grammar": "root ::= root"}, "nothing can satisfy the gbnf"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": CYCLE}}}, "nothing can satisfy"),
        ({"grammar": 'root ::= "a"{100000}'}, "too large or too deeply nested to follow: Too many items"),
        ({"grammar": "root ::= [ab] rule\nrule ::= rule"}, "the grammar cannot go on: no text can follow"),
    ],
)
def test_the_server_refuses_grammars_nothing_can_satisfy_or_follow(server, body, message):
    with server.http() as http:
        answer = _chat(http, **body)
    assert answer.status_code == 400, answer.text  # 200 with "", or a 500 with llguidance's internals
    assert message in answer.json()["error"]["message"]
    assert "\n" not in answer.json()["error"]["message"]


def test_slow_grammar_checks_hold_few_threads_and_one_more_is_a_503_in_each_apis_shape(server):
    """A grammar's first check runs at most MAX_CHECKS at once; one more is a 503 with Retry-After
    at once, so a plain request never waits behind them (on the event loop's default pool, twenty
    slow grammars made a plain chat wait 15.1 s instead of ~1 s)."""
    n_hostile = min(32, (os.cpu_count() or 1) + 4) + 4  # more than the event loop's default pool holds
    answers: dict[int, tuple[httpx.Response, float]] = {}

    def hostile(index: int) -> None:
        with server.http() as http:
            started = time.monotonic()
            answer = _chat(http, grammar=chained_rules(9000).replace('"y"', f'"y{index}"'))  # each new
            answers[index] = answer, time.monotonic() - started

    threads = [threading.Thread(target=hostile, args=(index,)) for index in range(n_hostile)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # each check under way (one holds its thread COMPILE_SECONDS), or refused
    with server.http() as http:
        started = time.monotonic()
        plain = _chat(http)
        plain_seconds = time.monotonic() - started
        tool = {"name": "f", "input_schema": {"type": "object", "properties": {"new": {"type": "integer"}}}}
        claude = http.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
        )
        schema = {"type": "object", "properties": {"also_new": {"type": "string"}}}
        ollama = http.post(
            "/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "format": schema}
        )
    for thread in threads:
        thread.join(2 * COMPILE_SECONDS + 30)
    assert plain.status_code == 200, plain.text
    assert plain_seconds < COMPILE_SECONDS - 2  # it waited for the first checks' deadline
    checked = [answer for answer, _ in answers.values() if answer.status_code == 400]
    refused = [(answer, seconds) for answer, seconds in answers.values() if answer.status_code == 503]
    assert len(checked) == MAX_CHECKS and len(refused) == n_hostile - MAX_CHECKS
    assert all("too large or too deeply nested" in answer.json()["error"]["message"] for answer in checked)
    for answer, seconds in refused:
        assert answer.headers["Retry-After"] == "1"
        assert answer.json()["error"]["code"] == "grammar_checks_busy"
        assert seconds < 2.0  # at once, not after a check
    assert claude.status_code == 503 and claude.headers["Retry-After"] == "1"
    assert claude.json()["error"]["type"] == "overloaded_error"  # Anthropic's shape
    assert ollama.status_code == 503 and ollama.headers["Retry-After"] == "1"
    assert set(ollama.json()) == {"error"}  # Ollama's shape
    with server.http() as http:  # the checks' places are free again
        assert _chat(http, grammar='root ::= "free"').json()["choices"][0]["message"]["content"] == "free"
