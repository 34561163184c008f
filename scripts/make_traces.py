"""Write the shipped traces (specgguf/bench/traces/*.jsonl; the format: specgguf/bench/traces.py).

    .venv/bin/python scripts/make_traces.py

Written for this project from what the clients send (not recorded from anyone):
- editor: llama.vscode typing shelf/stock.py. Its /infill body (src/llama-server.ts,
  createRequestPayload): input_prefix (the lines above the cursor, at most n_prefix 256),
  prompt (the cursor line up to the cursor, "" when only indentation), input_suffix (the rest
  of the line, a newline, at most n_suffix 64 lines below, a newline), input_extra (its ring of
  chunks: {text, time, filename}), n_predict 128, top_k 40, top_p 0.99, stream false,
  samplers [top_k, top_p, infill], cache_prompt true, n_indent (when not 0),
  t_max_prompt_ms 500, t_max_predict_ms 1000; and its warm-up when the ring changes
  (updateExtraContext: n_predict 0, samplers [], t_max_predict_ms 1, empty prefix and suffix).
  Its speculative follow-ups (cacheFutureSuggestion) depend on the answer and are left out.
- agent: an openai-agents-python style tool loop (Runner.run over Chat Completions: system
  instructions, the user's task, then assistant tool_calls and role "tool" results, the whole
  transcript re-sent each turn, `tools` as strict function schemas, tool_choice "auto"); the
  assistant turns come from a fixed script so the transcript is the same for every server.
- chat: fixed user turns, each line `"history": "replay"`: each server sees its own answers.
"""

from __future__ import annotations

import json
from pathlib import Path

from trace_texts import CHAT_TURNS, EDITOR_CHUNKS, EDITOR_SUFFIX, EDITOR_TARGET, agent_script  # scripts/ is on sys.path

OUT = Path(__file__).resolve().parent.parent / "specgguf" / "bench" / "traces"
N_PREFIX, N_SUFFIX = 256, 64
SECONDS_PER_CHAR, PAUSE_S = 0.11, 0.45
CLOCK_MS = 1_767_225_600_000  # the chunks' `time` (ms since 1970): a fixed day, read by no server
LLAMA_VSCODE = {
    "n_predict": 128,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
}


def chunk(filename: str, text: str, at_s: float) -> dict:
    return {"text": text, "time": CLOCK_MS + int(at_s * 1000), "filename": filename}


def infill(prefix: str, line: str, suffix: str, chunks: list[dict]) -> dict:
    prompt = "" if not line.strip() else line
    indent = len(line) - len(line.lstrip()) if line.strip() else len(line)
    body = {
        "input_prefix": "".join(prefix.splitlines(keepends=True)[-N_PREFIX:]),
        "input_suffix": "\n" + "".join(suffix.splitlines(keepends=True)[:N_SUFFIX]) + "\n",
        "input_extra": chunks,
        "prompt": prompt,
        **LLAMA_VSCODE,
    }
    if indent:
        body["n_indent"] = indent
    return body | {"t_max_prompt_ms": 500, "t_max_predict_ms": 1000}


def warm_up(chunks: list[dict]) -> dict:
    return {
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": chunks,
        "prompt": "",
        "n_predict": 0,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1,
    }


def editor() -> list[dict]:
    """Type EDITOR_TARGET line by line above EDITOR_SUFFIX: a request at each new line (after the
    indentation) and one mid-line on longer lines (after the first word), the ring growing by the
    test file halfway through."""
    lines = EDITOR_TARGET.splitlines()
    clock, chunks, requests = 0.0, [chunk(name, text, 0) for name, text in EDITOR_CHUNKS[:2]], []
    requests.append({"path": "/infill", "gap_s": 0.0, "body": warm_up(chunks)})
    typed = 0  # characters typed since the last request
    for index, line in enumerate(lines):
        if index == len(lines) // 2:
            name, text = EDITOR_CHUNKS[2]
            chunks = [*chunks, chunk(name, text, clock)]
            requests.append({"path": "/infill", "gap_s": 1.0, "body": warm_up(chunks)})
        prefix = "".join(f"{above}\n" for above in lines[:index])
        if not line.strip():
            typed += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        stops = [indent]
        content = line.strip()
        if len(content) >= 24 and " " in content:
            stops.append(indent + content[: content.index(" ") + 1])
        for stop in stops:
            gap = round(PAUSE_S + SECONDS_PER_CHAR * (typed + len(stop)), 2)
            clock += gap
            requests.append({"path": "/infill", "gap_s": gap, "body": infill(prefix, stop, EDITOR_SUFFIX, chunks)})
            typed = -len(stop)
        typed += len(line) + 1
    return requests


AGENT_INSTRUCTIONS = (
    "You are a coding agent working in a small Python repository. Use the tools to look at files before"
    " changing them, make the smallest change that fixes the task, run the tests, and finish with a short"
    " summary of what you changed."
)


def tool(name: str, description: str, **properties: str) -> dict:
    schema = {
        "type": "object",
        "properties": {key: {"type": "string", "description": text} for key, text in properties.items()},
        "required": list(properties),
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema, "strict": True},
    }


AGENT_TOOLS = [
    tool("list_files", "List the files under a folder of the repository.", path="A folder, relative to the root."),
    tool("read_file", "Read a text file of the repository.", path="A file, relative to the root."),
    tool("search", "Find lines matching a regular expression in the repository.", pattern="A Python regex."),
    tool(
        "edit_file",
        "Replace one exact occurrence of old_text with new_text in a file.",
        path="A file, relative to the root.",
        old_text="The text to replace, exactly as in the file.",
        new_text="The replacement.",
    ),
    tool("run_tests", "Run pytest on a path and return its output.", path="A test file or folder."),
]


AGENT_MAX_TOKENS = 512


def agent() -> list[dict]:
    """One request a turn: the transcript so far; after each, the script's tool call and its result."""
    task, steps = agent_script()
    messages: list[dict] = [{"role": "system", "content": AGENT_INSTRUCTIONS}, {"role": "user", "content": task}]
    requests = []
    for turn in range(len(steps) + 1):
        # A cap per turn, as an agent SDK's model settings send it: without one a server that does not
        # call a tool (or loops) writes until its context is full, and the replay measures that instead.
        body = {
            "model": "coder",
            "messages": [dict(m) for m in messages],
            "tools": AGENT_TOOLS,
            "tool_choice": "auto",
            "max_tokens": AGENT_MAX_TOKENS,
        }
        requests.append({"path": "/v1/chat/completions", "gap_s": 0.0 if turn == 0 else 0.3, "body": body})
        if turn == len(steps):
            break  # the last request is where the model writes its summary
        name, arguments, result = steps[turn]
        call_id = f"call_{turn + 1:03d}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]
    return requests


CHAT_SYSTEM = "You are a helpful programming assistant. Answer precisely; show code when it helps."


def chat() -> list[dict]:
    requests = []
    for turn, (text, max_tokens) in enumerate(CHAT_TURNS):
        messages = ([{"role": "system", "content": CHAT_SYSTEM}] if turn == 0 else []) + [
            {"role": "user", "content": text}
        ]
        line = {"path": "/v1/chat/completions", "gap_s": 0.0 if turn == 0 else round(3 + len(text) / 40, 1)}
        if turn:
            line["history"] = "replay"
        requests.append(line | {"body": {"messages": messages, "max_tokens": max_tokens}})
    return requests


def write(name: str, description: str, requests: list[dict]) -> None:
    lines = [json.dumps({"trace": name, "description": description})]
    lines += [json.dumps(request, ensure_ascii=False) for request in requests]
    (OUT / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{name}: {len(requests)} requests")


def main() -> None:
    write("editor", "llama.vscode typing shelf/stock.py, with chunks of two, then three, other files", editor())
    write("agent", "a tool-calling agent fixing parse_duration in a small repository (scripted turns)", agent())
    write("chat", "a chat about a small module, growing past 3,000 tokens (each server's own answers)", chat())


if __name__ == "__main__":
    main()
