"""scripts/trace_ties.py: where two greedy answers part, and the verifier's own logits there, computed in
a prompt pass's shape and token by token, on a real (tiny) GGUF."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from trace_ties import Parting, parting, prompt_tokens, scores, verdict  # noqa: E402 - the script, from scripts/

from specgguf.bench.traces import CHAT, TraceRequest  # noqa: E402
from specgguf.conversation import Message, Prompts  # noqa: E402
from specgguf.errors import SpecggufError  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "trace_ties.py"


def test_two_answers_part_at_their_first_unlike_token_or_where_one_ends():
    assert parting([5, 6, 7, 8], [5, 6, 9]) == Parting([5, 6], 7, 9)
    assert parting([5, 6], [5, 6, 7]) == Parting([5, 6], None, 7)
    assert parting([4], [5]) == Parting([], 4, 5)


def test_a_near_tie_is_a_small_gap_or_an_argmax_that_flips_between_shapes():
    split = Parting([1], 3, 4)

    def row(a: float, b: float, top: float = 0.0) -> np.ndarray:
        logits = np.zeros(8)
        logits[3], logits[4], logits[7] = a, b, top
        return logits

    kind, lines = verdict({"one pass": row(10.0, 10.1), "by tokens": row(10.0, 10.2)}, split, 0.25)
    assert kind == "near-tie" and "argmax other" in lines[0] and "gap -0.100" in lines[0]
    flipped = {"one pass": row(10.0, 11.0), "by tokens": row(11.0, 10.0)}  # a wide gap, but it flips
    assert verdict(flipped, split, 0.25)[0] == "near-tie"
    kind, lines = verdict({"one pass": row(9.0, 12.0), "by tokens": row(9.0, 12.0)}, split, 0.25)
    assert kind == "differs" and all("argmax other" in line for line in lines)
    kind, lines = verdict({"one pass": row(1.0, 2.0, top=5.0)}, split, 0.25)
    assert kind == "differs" and "argmax 7" in lines[0]  # neither server's token is the verifier's choice
    assert verdict({}, Parting([1, 2], None, 4), 0.25)[0] == "ended"


def _request(path: str, body: dict) -> TraceRequest:
    return TraceRequest(line=2, path=path, gap_s=0.0, body=body, replay_history=False)


def test_a_prompt_is_read_by_the_servers_own_request_models(tiny):
    prompts = Prompts(tiny)
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    chat = prompt_tokens(prompts, tiny, _request(CHAT, {"messages": [parts]}), [], 128)
    assert chat == prompts.chat_tokens([Message("user", "a\nb")])  # text parts joined by new lines, as the server does
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    replayed = prompt_tokens(prompts, tiny, _request(CHAT, {"messages": [parts]}), history, 128)
    assert replayed == prompts.chat_tokens(
        [Message("user", "hi"), Message("assistant", "hello"), Message("user", "a\nb")]
    )
    stray = {"messages": [{"role": "tool", "tool_call_id": "c9", "content": "42"}]}  # answers no call
    with pytest.raises(SpecggufError, match="trace line 2: messages\\[0\\] answers a tool call"):
        prompt_tokens(prompts, tiny, _request(CHAT, stray), [], 128)
    with pytest.raises(SpecggufError, match="no FIM tokens"):  # the tiny model has none
        prompt_tokens(prompts, tiny, _request("/infill", {"input_prefix": "a"}), [], 128)


@pytest.fixture(scope="module")
def tiny(tiny_verifier) -> Iterator[LlamaModel]:
    model = LlamaModel(tiny_verifier, n_ctx=128, n_threads=1)
    yield model
    model.close()


def _greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    model.rewind(0)
    row, out = model.eval(prompt, n_logits=1)[-1], []
    for _ in range(n):
        out.append(int(np.argmax(row)))
        row = model.eval([out[-1]], n_logits=1)[-1]
    return out


def test_both_shapes_score_the_same_row_as_plain_decoding_does(tiny):
    prompt = tiny.tokenize("hello there", special=True)
    answer = _greedy(tiny, prompt, 6)
    rows = scores(tiny, prompt, answer[:4])
    assert set(rows) == {"one pass", "by tokens"}
    for row in rows.values():
        assert int(np.argmax(row)) == answer[4]  # the row after four greedy tokens scores the fifth
    np.testing.assert_allclose(rows["one pass"], rows["by tokens"], atol=1e-2)


def test_the_script_reports_each_parting_of_a_run_with_the_same_history(tiny, tiny_verifier, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"trace": "t", "description": "two chat turns"})
        + "\n"
        + json.dumps(
            {"path": "/v1/chat/completions", "gap_s": 0, "body": {"messages": [{"role": "user", "content": "hi"}]}}
        )
        + "\n"
    )
    reference, other = "hello hello there", "hello there"

    def reply(text: str, compared: str) -> dict:
        return {"compared": compared, "history_differs": False, "text": text}

    run = {
        "traces": [
            {
                "trace": "t",
                "requests": [
                    {
                        "index": 1,
                        "servers": {
                            "llama-server plain": reply(reference, "reference"),
                            "specgguf serve": reply(other, "differs"),
                        },
                    }
                ],
            }
        ]
    }
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(run))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(saved), "-m", str(tiny_verifier), "-t", "1", "-c", "128"]
        + ["--trace-file", f"t={trace}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("t request 1 (specgguf serve against llama-server plain): ")
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["one pass", "by tokens"]
    assert lines[-1].startswith("partings: 1 ")


def test_a_run_that_is_not_json_is_one_error_line(tmp_path, tiny_verifier):
    saved = tmp_path / "run.json"
    saved.write_text("{not json")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(saved), "-m", str(tiny_verifier)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr.startswith("specgguf: error:") and "Traceback" not in done.stderr
