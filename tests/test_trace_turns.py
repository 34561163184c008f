"""The measurement scripts read a trace's chat requests as the server does (scripts/ngram_evidence.py's
`greedy_turns`, which policy_replay.py and trace_ab.py replay): an agent's transcript, its tool calls
(content null), tool results and the tools offered, renders through the model's template, one turn per
request. (Before, the calls and the tools were left out of the prompt.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import ngram_evidence  # noqa: E402 - the script, from scripts/

from specgguf.bench.traces import CHAT, load_trace  # noqa: E402
from specgguf.llama.loaded import ModelSettings  # noqa: E402
from tiny_gguf import write_tiny_llama  # noqa: E402

# A template that writes what an agent's transcript holds: each call by name, and the tools offered.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}tool {{ t['function']['name'] }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}call {{ c['function']['name'] }}\n"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_an_agent_trace_reads_as_turns_with_its_calls_results_and_tools(tmp_path):
    model = write_tiny_llama(tmp_path / "tools.gguf", base_seed=7, chat_template=TOOL_TEMPLATE)
    verifier = ModelSettings(n_ctx=16384, n_threads=1).load(model)
    requests = load_trace("agent").requests
    chats = [request for request in requests if request.path == CHAT]
    turns = list(ngram_evidence.greedy_turns(verifier, requests, answers=["ok"] * len(chats)))
    assert [index for index, *_ in turns] == [i for i, request in enumerate(requests) if request.path == CHAT]
    calls = results = 0
    for (_, tokens, new, reply), request in zip(turns, chats):
        text = b"".join(verifier.token_bytes(token) for token in tokens).decode("utf-8", errors="replace")
        assert 0 < new < len(tokens) and reply == verifier.tokenize("ok", special=False)
        assert all(f"tool {tool['function']['name']}\n" in text for tool in request.body["tools"])
        for message in request.body["messages"]:
            for call in message.get("tool_calls") or []:
                calls += 1
                assert f"call {call['function']['name']}\n" in text
            if message["role"] == "tool":
                results += 1
                assert message["content"][:40] in text
    assert calls > 0 and results > 0
