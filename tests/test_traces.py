"""Replayable client traces: the shipped ones are what their clients send, a malformed one is refused
with its file and line, and the runner replays a short trace against real servers (bench/traces.py,
bench/trace_replay.py, bench/trace_servers.py, bench/trace_report.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from specgguf.bench.trace_replay import Comparison, Reply, Row, Transcript, compare, prepared_body, replay, send
from specgguf.bench.trace_report import report_json, row_lines, total_lines
from specgguf.bench.trace_servers import PairSettings, ServerSpec, llama_server_specs, running
from specgguf.bench.traces import CHAT, TraceError, load_trace, parse_trace
from specgguf.errors import SpecggufError

HEADER = '{"trace": "t", "description": "a test"}'
INFILL = '{"path": "/infill", "gap_s": 0.5, "body": {"input_prefix": "def f(", "prompt": ""}}'
CHAT_LINE = '{"path": "/v1/chat/completions", "gap_s": 1, "body": {"messages": [{"role": "user", "content": "hi"}]}}'


def test_the_editor_trace_types_a_module_as_llama_vscode_asks():
    trace = load_trace("editor")
    infills = [r for r in trace.requests if r.path == "/infill"]
    assert len(infills) == len(trace.requests) >= 40
    asks = [r.body for r in infills if r.body["n_predict"] > 0]
    files = {chunk["filename"] for body in asks for chunk in body["input_extra"]}
    assert 2 <= len(files) <= 3 and "shelf/stock.py" not in files
    for body in asks:
        assert body["samplers"] == ["top_k", "top_p", "infill"] and body["cache_prompt"] is True
        assert (body["top_k"], body["top_p"], body["t_max_prompt_ms"], body["t_max_predict_ms"]) == (
            40,
            0.99,
            500,
            1000,
        )
        assert body["input_suffix"].endswith("\n") and "def demo()" in body["input_suffix"]
        assert body.get("n_indent", 0) == len(body["prompt"]) - len(body["prompt"].lstrip()) or not body["prompt"]
    # the module grows request by request: each prefix extends the one before (or is the same line's)
    prefixes = [body["input_prefix"] for body in asks]
    assert all(later.startswith(earlier) for earlier, later in zip(prefixes, prefixes[1:]))
    warm_ups = [r.body for r in infills if r.body["n_predict"] == 0]
    assert len(warm_ups) == 2 and all(body["t_max_predict_ms"] == 1 and body["samplers"] == [] for body in warm_ups)


def test_the_agent_trace_re_sends_a_growing_transcript_of_tool_calls():
    trace = load_trace("agent")
    assert len(trace.requests) >= 15 and all(r.path == CHAT and not r.replay_history for r in trace.requests)
    lengths = [len(r.body["messages"]) for r in trace.requests]
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    last = trace.requests[-1].body
    assert last["tool_choice"] == "auto" and {t["function"]["name"] for t in last["tools"]} >= {
        "read_file",
        "edit_file",
    }
    calls = [m for m in last["messages"] if m["role"] == "assistant"]
    results = [m for m in last["messages"] if m["role"] == "tool"]
    assert len(calls) == len(results) == len(trace.requests) - 1
    assert all(json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in calls)
    assert [m["tool_call_id"] for m in results] == [m["tool_calls"][0]["id"] for m in calls]
    # each request's transcript is the one before it, plus a call and its result
    for earlier, later in zip(trace.requests, trace.requests[1:]):
        assert later.body["messages"][: len(earlier.body["messages"])] == earlier.body["messages"]


def test_the_chat_trace_replays_each_servers_own_answers():
    trace = load_trace("chat")
    assert [r.replay_history for r in trace.requests] == [False] + [True] * (len(trace.requests) - 1)
    assert all(r.body["messages"][-1]["role"] == "user" for r in trace.requests)
    # user turns (~4 characters a token) and the answers' budgets together pass 3,000 tokens
    user = sum(len(m["content"]) for r in trace.requests for m in r.body["messages"]) // 4
    assert user + sum(r.body["max_tokens"] for r in trace.requests) > 3000


def test_a_valid_trace_loads_with_its_lines():
    trace = parse_trace("\n".join([HEADER, INFILL, "", CHAT_LINE]), source="t.jsonl")
    assert (trace.name, trace.description) == ("t", "a test")
    assert [(r.line, r.path, r.gap_s) for r in trace.requests] == [(2, "/infill", 0.5), (4, CHAT, 1.0)]
    assert trace.cut(1).requests == trace.requests[:1]


REPLAY = CHAT_LINE.replace('"gap_s": 1,', '"gap_s": 1, "history": "replay",')


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "t.jsonl: empty"),
        (["[1]"], "t.jsonl:1: expected a JSON object"),
        (['{"name": "x"}', INFILL], "t.jsonl:1: unknown header key 'name'"),
        (['{"description": "x"}', INFILL], "t.jsonl:1: the first line is the header"),
        ([HEADER], "t.jsonl: no requests after the header"),
        ([HEADER, INFILL, "{oops"], "t.jsonl:3: not JSON"),
        ([HEADER, INFILL.replace("gap_s", "gap")], "t.jsonl:2: unknown key 'gap'"),
        ([HEADER, '{"path": "/infill", "body": {}}'], "t.jsonl:2: missing gap_s"),
        ([HEADER, INFILL.replace("/infill", "/v1/embeddings")], "t.jsonl:2: path '/v1/embeddings' is not one of"),
        ([HEADER, INFILL.replace("0.5", "-1")], "t.jsonl:2: gap_s must be seconds"),
        ([HEADER, INFILL.replace("0.5", "true")], "t.jsonl:2: gap_s must be seconds"),
        ([HEADER, INFILL.replace('{"input_prefix": "def f(", "prompt": ""}', "[]")], "t.jsonl:2: body must be"),
        ([HEADER, INFILL.replace('"def f("', "3")], "t.jsonl:2: input_prefix and prompt must be texts"),
        ([HEADER, CHAT_LINE.replace('[{"role": "user", "content": "hi"}]', "[]")], "t.jsonl:2: a chat body needs"),
        ([HEADER, INFILL.replace('"gap_s"', '"history": "replay", "gap_s"')], "t.jsonl:2: history replays chat"),
        ([HEADER, CHAT_LINE, REPLAY.replace('"replay"', '"keep"')], 't.jsonl:3: history takes only "replay"'),
        ([HEADER, REPLAY], "t.jsonl:2: the first request has no history to replay"),
    ],
)
def test_a_malformed_trace_names_its_file_and_line(lines, message):
    with pytest.raises(TraceError) as caught:
        parse_trace("\n".join(lines), source="t.jsonl")
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_missing_trace_file_is_one_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(str(tmp_path / "nowhere.jsonl"))


def test_bodies_are_greedy_streamed_and_replay_this_servers_history():
    trace = parse_trace("\n".join([HEADER, CHAT_LINE, REPLAY]), source="t")
    transcript = Transcript()
    first = prepared_body(trace.requests[0], transcript, greedy=True)
    assert first["temperature"] == 0 and first["top_k"] == 1 and first["stream"] and first["cache_prompt"]
    transcript.messages.append({"role": "assistant", "content": "hello"})
    second = prepared_body(trace.requests[1], transcript, greedy=False)
    assert [m["content"] for m in second["messages"]] == ["hi", "hello", "hi"] and "top_k" not in second
    assert trace.requests[1].body["messages"] == [{"role": "user", "content": "hi"}]  # the trace is left as it was
    warm_up = parse_trace(
        "\n".join([HEADER, INFILL.replace('"prompt": ""', '"prompt": "", "samplers": []')]), source="t"
    )
    assert prepared_body(warm_up.requests[0], Transcript(), greedy=True)["samplers"] == ["top_k"]


def test_answers_compare_as_equal_prefix_or_where_they_part():
    def reply(text: str, error: str | None = None) -> Reply:
        return Reply(text, 0.1, 1.0, 3, error=error)

    assert compare(reply("abc"), reply("abc")) == Comparison("equal")
    assert compare(reply("ab"), reply("abc")) == Comparison("prefix", 2)
    assert compare(reply("abX"), reply("abc")).label() == "differs at char 2"
    # The same call, parsed by one server and left as the JSON the model wrote by the other (bare or fenced).
    parsed = reply('read_file({"path":"a.py"})')
    assert compare(parsed, reply('{"name": "read_file", "arguments": {"path": "a.py"}}')).kind == "call"
    assert compare(parsed, reply('```json\n{"name": "read_file", "arguments": {"path": "a.py"}}\n```')).kind == "call"
    assert compare(parsed, reply('\nread_file({"path": "a.py"})')).label() == "= as a call"
    assert compare(parsed, reply('{"name": "read_file", "arguments": {"path": "b.py"}}')).kind == "differs"
    assert compare(parsed, reply('{"name": "read_file", "arguments": {"path": "a.py"}, "x": 1}')).kind == "differs"
    assert compare(reply("[1, 2]"), reply("[1,2]")).kind == "differs"
    request = parse_trace("\n".join([HEADER, CHAT_LINE]), source="t").requests[0]
    rows = [
        Row(
            1,
            request,
            {"ref": reply("{}"), "ours": reply("f({})")},
            {"ref": Comparison("reference"), "ours": Comparison("call")},
        ),
        Row(
            2,
            request,
            {"ref": reply("ab"), "ours": reply("ab")},
            {"ref": Comparison("reference"), "ours": Comparison("equal")},
        ),
    ]
    assert "1/2 equal, 1 the same call, 0 prefix" in total_lines("t", rows)[2]
    assert compare(reply("", "HTTP 500"), reply("abc")).kind == "error"
    assert Reply("abc", 0.5, 2.5, 5).tokens_per_second == pytest.approx(2.0)
    assert Reply("", None, 0.1, 0).tokens_per_second is None


def _events(*events: dict) -> httpx.Client:
    stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, text=stream)))


def test_a_streamed_tool_call_is_gathered_and_compared_by_what_it_calls():
    def call(**fields) -> dict:
        return {"choices": [{"delta": {"tool_calls": [{"index": 0, **fields}]}}]}

    events = [
        call(id="c1", function={"name": "read_file", "arguments": ""}),
        call(function={"arguments": '{"path": '}),
        call(function={"arguments": '"a.py"}'}),
        {"choices": [{"delta": {}}], "timings": {"predicted_n": 9, "prompt_n": 3, "cache_n": 40}},
    ]
    with _events(*events) as client:
        reply = send(client, "http://t", CHAT, {})
    assert reply.text == 'read_file({"path":"a.py"})' and reply.n_tokens == 9 and reply.ttft_s is not None
    assert reply.n_prompt == 43
    assert reply.message is not None and reply.message["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'
    with _events(
        {"content": "x = ", "stop": False}, {"content": "1", "stop": False}, {"content": "", "stop": True}
    ) as client:
        infill = send(client, "http://t", "/infill", {})
    assert (infill.text, infill.n_tokens) == ("x = 1", 2)  # no timings: the pieces streamed
    refused = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(400, text="no FIM")))
    assert send(refused, "http://t", "/infill", {}).error == "HTTP 400: no FIM"


def test_an_end_token_llama_server_counts_is_not_counted_as_the_answers():
    """llama-server's predicted_n counts the end-of-generation token of an answer that ended there, and
    specgguf's does not: the rates compare the answers' tokens, so one fewer is llama-server's."""

    def infill(stop_type: str) -> httpx.Client:
        return _events(
            {"content": "x = 1", "stop": False},
            {"content": "", "stop": True, "stop_type": stop_type, "timings": {"predicted_n": 6}},
        )

    def chat(reason: str) -> httpx.Client:
        return _events(
            {"choices": [{"delta": {"content": "hi"}}]},
            {"choices": [{"delta": {}, "finish_reason": reason}], "timings": {"predicted_n": 6}},
        )

    for client, path, body, counts_eog, n in [
        (infill("eos"), "/infill", {}, True, 5),
        (infill("eos"), "/infill", {}, False, 6),  # specgguf's count is the answer's already
        (infill("limit"), "/infill", {}, True, 6),  # n_predict's limit: no end token was generated
        (chat("stop"), CHAT, {}, True, 5),
        (chat("tool_calls"), CHAT, {}, True, 5),
        (chat("length"), CHAT, {}, True, 6),
        (chat("stop"), CHAT, {"stop": ["\n"]}, True, 6),  # a stop string may have ended it: counted as said
    ]:
        with client:
            assert send(client, "http://t", path, body, counts_eog=counts_eog).n_tokens == n, (path, body, n)
    assert all(
        spec.counts_eog
        for spec in llama_server_specs(
            Path("ls"), PairSettings(Path("v"), Path("d"), 2, 512), draft_ks=[4], ngram_types=["x"]
        )
    )


@pytest.mark.live  # the runner starts the servers (tests/kinds.py)
def test_the_runner_replays_a_trace_against_two_real_servers(tmp_path, tiny_verifier, tiny_draft):
    """A second specgguf serve stands in for llama-server (the same greedy answers, by construction)."""
    lines = [
        HEADER,
        '{"path": "/v1/completions", "gap_s": 0, "body": {"prompt": "the of and", "max_tokens": 6}}',
        CHAT_LINE.replace('"hi"}]', '"the of"}], "max_tokens": 5'),
        REPLAY.replace('"hi"}]', '"and to"}], "max_tokens": 5'),
        '{"path": "/infill", "gap_s": 0.2, "body": {"input_prefix": "the ", "input_suffix": " of", "n_predict": 4}}',
    ]
    trace = parse_trace("\n".join(lines), source="t")
    command = (sys.executable, "-m", "specgguf", "serve", "-m", str(tiny_verifier), "-md", str(tiny_draft))
    command += ("-c", "512", "-t", "1", "-k", "2")
    with running([ServerSpec("reference", command), ServerSpec("specgguf", command)], startup_seconds=120) as servers:
        rows = replay(trace, servers, honour_gaps=True)
        assert all(server.process.poll() is None for server in servers)
    assert [row.index for row in rows] == [1, 2, 3, 4]
    for row in rows[:3]:
        assert row.comparisons["specgguf"].kind == "equal", row_lines(row)
        for reply in row.replies.values():
            assert reply.error is None and reply.n_tokens > 0 and reply.ttft_s is not None
            assert reply.ttft_s <= reply.total_s
        assert row.replies["specgguf"].n_prompt == row.replies["reference"].n_prompt > 0
        assert all(reply.prompt_ms is not None and reply.prompt_ms >= 0 for reply in row.replies.values())
    assert rows[1].replies["reference"].message is not None
    infill = rows[3].replies["reference"]  # the tiny model has no FIM tokens: llama-server's 4xx, recorded
    assert infill.error is None or infill.error.startswith("HTTP 4")
    text = "\n".join(total_lines("t", rows))
    assert "reference" in text and "specgguf" in text and "equal" in text
    report = report_json("t", rows)
    assert [r["index"] for r in report["requests"]] == [1, 2, 3, 4] and len(report["totals"]) == 2


@pytest.mark.live  # (it tries to start one)
def test_a_server_program_that_does_not_exist_is_one_error(tmp_path):
    servers = running([ServerSpec("llama-server plain", (str(tmp_path / "llama-server"), "-m", "x.gguf"))])
    with pytest.raises(SpecggufError, match="cannot start llama-server plain .*No such file"), servers:
        pass


def test_llama_cpps_servers_run_as_users_run_them_without_our_settings(monkeypatch, tmp_path):
    # llama.cpp's environment is bench's one helper's (as its programs in `bench --vs-llama-cpp`), less our
    # server's API key; its own flags' twins (LLAMA_ARG_*) would change what it runs, so none passes.
    from specgguf.bench.trace_servers import _environment
    from specgguf.llama import huge_pages

    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "7")
    monkeypatch.setenv("SPECGGUF_API_KEY", "secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    monkeypatch.setenv("TZ", "Europe/Paris")  # the user's own: kept
    monkeypatch.setenv("GLIBC_TUNABLES", huge_pages.TUNABLE)
    monkeypatch.setenv(huge_pages.SWITCH, huge_pages.ADDED)  # ours, added when specgguf started again
    env = _environment(tmp_path / "llama-server")
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}:/opt/lib"
    assert not [
        name for name in env if name.startswith("LLAMA_ARG_") or name in ("SPECGGUF_API_KEY", huge_pages.SWITCH)
    ]
    assert "GLIBC_TUNABLES" not in env and env["TZ"] == "Europe/Paris"


def test_a_script_starts_again_with_the_programs_pages_before_its_main_and_an_error_is_one_line(monkeypatch):
    # What a script times in-process is timed as `specgguf` runs (huge pages where the program has them).
    from specgguf.bench import trace_servers

    calls: list[str] = []
    monkeypatch.setattr(trace_servers, "restart_with_huge_pages", lambda: calls.append("restart"))
    monkeypatch.setattr(trace_servers.signal, "signal", lambda *handler: None)  # not this test process's SIGTERM
    trace_servers.run_script(lambda: calls.append("main"))
    assert calls == ["restart", "main"]

    def fails() -> None:
        raise SpecggufError("no such trace")

    with pytest.raises(SystemExit, match="specgguf: error: no such trace"):
        trace_servers.run_script(fails)
