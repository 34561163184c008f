"""Transcript tests of `specgguf chat` on real tiny GGUF files: piped, with slash commands, and in a
terminal under tmux (Ctrl-C mid-answer, history across sessions)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SPECGGUF = [sys.executable, "-m", "specgguf"]


@pytest.fixture
def chat(cli):
    """`specgguf chat ARGS...` with piped questions, in-process."""
    return lambda *args, stdin="": cli("chat", *args, stdin=stdin)


@pytest.fixture(scope="module")
def tiny(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "1024", "--temp", "0", "-n", "24", "-k", "3"]


def stats_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "tok/s" in line and "first token" in line]


def test_piped_questions_get_one_plain_answer_each(cli, chat, tiny, tmp_path):
    transcript = tmp_path / "chat.json"
    result = chat(*tiny, "--system", "be brief", stdin=f"hello the cat\n\nand the dog\n/save {transcript}\n")
    assert result.returncode == 0, result.stderr
    answers = [turn["assistant"] for turn in json.loads(transcript.read_text())["turns"]]
    assert len(answers) == 2 and all(answers)  # the empty line was skipped
    assert result.stdout == answers[0] + "\n\n" + answers[1] + "\n"  # answers only, blank-line separated
    assert "\x1b" not in result.stdout + result.stderr and ">>>" not in result.stdout
    assert len(stats_lines(result.stderr)) == 2
    # The first turn is exactly what `run` answers to the same prompt.
    single = cli("run", *tiny, "--system", "be brief", "hello the cat")
    assert single.stdout == answers[0] + "\n"


def test_the_second_turn_reuses_the_first_from_the_cache(chat, tiny):
    result = chat(*tiny, stdin="hello the cat\nand the dog\n")
    first, second = (
        re.search(r"prompt (\d+) tokens, (\d+) cached", line).groups() for line in stats_lines(result.stderr)
    )
    assert first[1] == "0"
    n_prompt, n_cached = map(int, second)
    # Turn 2 is the conversation's text tokenized fresh: all of turn 1's prompt came from the cache, and
    # its answer as far as the tokens generated are what its text tokenizes to (the tiny model's
    # random answers soon stop being that; tests/test_chat_session.py counts it exactly).
    assert int(first[0]) <= n_cached < n_prompt


def test_slash_commands(chat, tiny, tmp_path):
    script = [
        "/help",
        "/k 2",
        "/k many",
        "/temp 0.5",
        "/temp hot",
        "/n 10",
        "/n 0",
        "hello the cat",
        "/temp 0",
        "and the dog",
        "//k is not a command",
        "/stats",
        f"/save {tmp_path / 'chat.md'}",
        f"/save {tmp_path / 'chat.json'}",
        f"/save {tmp_path / 'no' / 'such' / 'dir.md'}",
        "/nonsense",
        "/reset",
        "/stats",
        "/exit",
        "never answered",
    ]
    # Seeded: at /temp 0.5 the tiny model ends the first answer early for some seeds (EOS after 8 tokens
    # for one in 200), and this answer is to show /n 10's bound.
    result = chat(*tiny, "--system", "you are a tiny model", "--seed", "5", stdin="\n".join(script) + "\n")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "/save FILE" in err and "Ctrl-C" in err  # /help
    assert "K=2 (-k)" in err and "usage: /k N" in err
    assert "temperature 0.5" in err and "usage: /temp X" in err
    assert "at most 10 tokens per answer" in err and "usage: /n N" in err
    assert "unknown command /nonsense" in err and "could not save" in err
    assert "conversation forgotten (the system prompt stays)" in err
    stats = [line for line in err.splitlines() if line.startswith(("3 answers", "0 answers"))]
    assert stats[0].startswith("3 answers") and stats[-1].startswith("0 answers")
    assert "acceptance by draft position: 1: " in err and "K=2 (-k) · temperature 0 · context" in err
    report = json.loads((tmp_path / "chat.json").read_text())
    assert report["system"] == "you are a tiny model" and report["settings"]["k"] == "K=2 (-k)"
    turns = report["turns"]
    assert [turn["user"] for turn in turns] == ["hello the cat", "and the dog", "/k is not a command"]
    assert turns[0]["n_tokens"] == 10 and turns[0]["stop"] == "max_tokens" and turns[0]["in_context"]
    assert turns[1]["prompt_tokens_evaluated"]["verifier"] < turns[1]["prompt_tokens"] / 2
    assert report["totals"]["n_tokens"] == sum(turn["n_tokens"] for turn in turns)
    markdown = (tmp_path / "chat.md").read_text()
    assert "## System\n\nyou are a tiny model" in markdown and "## User\n\nand the dog" in markdown
    assert markdown.count("## Assistant") == 3 and turns[1]["assistant"].strip() in markdown
    assert result.stdout.count("\n\n") >= 2 and "never answered" not in err


def test_a_full_context_drops_old_turns_and_goes_on(chat, tiny_verifier, tiny_draft):
    questions = ["hello the cat", "and the dog", "what is the time", "the end", "the " * 300, "why"]
    result = chat(
        "-m",
        tiny_verifier,
        "-md",
        tiny_draft,
        "-c",
        "160",
        "--temp",
        "0",
        "-n",
        "30",
        "-k",
        "3",
        "--system",
        "be brief",
        stdin="\n".join(questions) + "\n",
    )
    # The one question too long for the context fails; the others are answered, and the exit
    # status tells a script that one answer is missing.
    assert result.returncode == 1, result.stderr
    assert (
        result.stderr.strip().splitlines()[-1] == "specgguf: error: 1 question got no complete answer"
        " (see the messages above)"
    )
    assert "is full: dropped the" in result.stderr and "kept the system prompt" in result.stderr
    assert "context holds 160" in result.stderr  # the one message too long for it
    assert len(stats_lines(result.stderr)) == 5 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["-k", "many"], "-k/--draft-max takes a number"),
        (["--temp", "-1"], "--temp"),
        (["--drafter", "psychic"], "--drafter must be one of"),
        (["-m", "/nonexistent/model.gguf"], "no such file"),
        (["--pair", "nonesuch"], "no pair named"),
    ],
)
def test_bad_options_are_one_line_and_a_nonzero_exit(chat, args, expected):
    result = chat(*args, stdin="hello\n")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("specgguf: error: "), result.stderr
    assert expected in lines[0] and result.stdout == ""


# --- a real terminal, under tmux -------------------------------------------------------------
class Tmux:
    def __init__(self, command: str, env: dict):
        self.server = f"specgguf-test-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        self.tmux(
            "new-session", "-d", "-x", "150", "-y", "50", f"env {exports} {command}; echo CHAT-EXIT=$?; sleep 120"
        )

    def tmux(self, *args) -> str:
        return subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "0", *keys)

    def pane(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-1000", "-t", "0")

    def wait(self, condition, what: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.pane()
            if condition(text):
                return text
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; the pane:\n{self.pane()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sessions = []

    def start(args) -> Tmux:
        command = " ".join(shlex.quote(str(a)) for a in [*SPECGGUF, "chat", *args])
        session = Tmux(
            command,
            {
                "XDG_STATE_HOME": str(tmp_path / "state"),
                "TERM": "xterm-256color",
                "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            },
        )
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.close()


def _prompts(text: str) -> int:
    return len(re.findall(r"^>>> ", text, flags=re.M))


def test_ctrl_c_stops_an_answer_and_the_next_question_is_answered(terminal, tiny_verifier, tiny_draft, tmp_path):
    history = tmp_path / "state" / "specgguf" / "chat_history"
    history.parent.mkdir(parents=True)
    history.write_text("an old question\n")
    # -n and -c large enough that the first answer is still streaming when Ctrl-C arrives.
    tty = terminal(["-m", tiny_verifier, "-md", tiny_draft, "-c", "30000", "-n", "25000", "--temp", "0"])
    tty.wait(lambda text: _prompts(text) == 1, "the prompt")
    tty.keys("Up")  # readline history from the file an earlier session wrote
    tty.wait(lambda text: ">>> an old question" in text, "the history line")
    tty.keys("C-u", "the cat was", "Enter")
    tty.wait(lambda text: len(text.split(">>> the cat was", 1)[-1].strip()) > 20, "the answer to start")
    tty.keys("C-c")
    text = tty.wait(lambda text: _prompts(text) == 2, "the prompt after Ctrl-C")
    assert "(interrupted)" in text and "Traceback" not in text
    n_shown = int(re.search(r"(\d+) tokens · ", text).group(1))
    assert 0 < n_shown < 25000
    tty.keys("/n 12", "Enter")
    tty.wait(lambda text: _prompts(text) == 3, "the prompt after /n")
    tty.keys("hello the dog", "Enter")
    text = tty.wait(lambda text: _prompts(text) == 4, "the second answer")
    answer = text.split(">>> hello the dog", 1)[1]
    assert re.search(r"\b12 tokens · .* tok/s", answer) and "(interrupted)" not in answer
    tty.keys(f"/save {tmp_path / 'chat.json'}", "Enter")
    tty.wait(lambda text: "saved 2 turns" in text, "/save")
    tty.keys("C-d")
    text = tty.wait(lambda text: "CHAT-EXIT=" in text, "chat to exit")
    assert "CHAT-EXIT=0" in text
    # What was shown of the stopped answer stayed in the conversation.
    interrupted, second = json.loads((tmp_path / "chat.json").read_text())["turns"]
    assert interrupted["stop"] == "interrupted" and interrupted["n_tokens"] == n_shown and interrupted["in_context"]
    assert second["prompt_tokens"] > interrupted["prompt_tokens"] + n_shown
    # The history file was appended to, line by line, never rewritten.
    assert history.read_text().splitlines() == [
        "an old question",
        "the cat was",
        "/n 12",
        "hello the dog",
        f"/save {tmp_path / 'chat.json'}",
    ]


def test_ctrl_c_at_the_prompt_leaves_cleanly(terminal, tiny_verifier, tiny_draft):
    tty = terminal(["-m", tiny_verifier, "-md", tiny_draft, "-c", "256"])
    tty.wait(lambda text: _prompts(text) == 1, "the prompt")
    tty.keys("C-c")
    text = tty.wait(lambda text: "CHAT-EXIT=" in text, "chat to exit")
    assert "CHAT-EXIT=0" in text and "Traceback" not in text and "error" not in text
