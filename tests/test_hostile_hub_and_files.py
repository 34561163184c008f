"""A hostile but fair user, hub and file: every case ends in one `specgguf: error:` line (or a warning)
and a non-zero exit, never a traceback or a hang, and nothing is written outside its root.

The hub cases run `specgguf pull` (in-process, the `cli` fixture) against the local stand-in
(tests/hub_server.py) answering with hostile headers; the file cases use tiny GGUFs made here with
hostile metadata. Closed streams and Ctrl-C run the real command in a new process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_server import FakeHub
from tiny_gguf import write_tiny_llama

SPECGGUF = [sys.executable, "-m", "specgguf"]
VERIFIER_REPO = "test/tiny-verifier-GGUF"


def files_under(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


# --- a hostile hub ------------------------------------------------------------------------
@pytest.fixture
def hub(tiny_verifier, tiny_draft):
    server = FakeHub()
    server.add(VERIFIER_REPO, "verifier.gguf", tiny_verifier.read_bytes())
    server.add("test/tiny-draft-GGUF", "draft.gguf", tiny_draft.read_bytes())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sandbox(tmp_path, hub):
    """HF cache, specgguf cache and config inside tmp_path/root; tmp_path/outside must stay untouched."""
    root = tmp_path / "root"
    (root / "config" / "specgguf").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(root / "hf"),
        "SPECGGUF_CACHE": str(root / "cache"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "NO_COLOR": "1",
    }
    return tmp_path, env


def pull_pair(cli, env: dict):
    return cli(
        "pull", "--verifier", f"{VERIFIER_REPO}/verifier.gguf", "--draft", "test/tiny-draft-GGUF/draft.gguf", env=env
    )


@pytest.mark.parametrize(
    "header, value",
    [
        ("X-Linked-Etag", '"../../../../outside/x"'),
        ("X-Linked-Etag", '"../../../../../../../../outside/x"'),
        ("X-Linked-Etag", '"not-a-sha256"'),
        ("X-Linked-Etag", '"' + "A" * 64 + '"'),  # upper case: not what the hub sends
        ("X-Repo-Commit", "../../../../outside"),
        ("X-Repo-Commit", "../../../../../../../../outside"),
        ("X-Repo-Commit", "0123abc"),
        ("X-Repo-Commit", "\x1b]0;pwned\x07" + "0" * 33),
    ],
)
def test_hub_headers_never_become_paths_outside_the_cache(cli, hub, sandbox, header, value):
    tmp_path, env = sandbox
    hub.hostile_headers[VERIFIER_REPO] = {header: value}
    result = pull_pair(cli, env)
    line = result.error_line()
    assert "refusing" in line and "nothing was written" in line
    assert files_under(tmp_path / "outside") == set()
    assert not any(name.endswith(".gguf") or "blobs/" in name for name in files_under(tmp_path / "root"))
    assert "ready" not in result.stderr


def test_a_file_whose_sha256_cannot_be_established_is_not_pulled(cli, hub, sandbox):
    # A 40-digit ETag is a git blob hash: nothing to check the bytes against, so never "verified".
    _, env = sandbox
    hub.hostile_headers[VERIFIER_REPO] = {"X-Linked-Etag": '"' + "ab" * 20 + '"'}
    line = pull_pair(cli, env).error_line()
    assert "cannot be verified" in line and "sha256" in line


def test_a_redirect_loop_is_one_clear_line(cli, hub, sandbox):
    _, env = sandbox
    hub.redirect_loop.add(VERIFIER_REPO)
    line = cli(
        "pull", "--verifier", f"{VERIFIER_REPO}/verifier.gguf", "--draft", "test/tiny-draft-GGUF/draft.gguf", env=env
    ).error_line()
    assert "redirect" in line


@pytest.mark.parametrize(
    "field, value",
    [
        ("revision", "../../../../outside"),
        ("revision", "/etc"),
        ("repo", "../.."),
        ("repo", "a/.."),
        ("file", "../x.gguf"),
        ("file", "/tmp/x.gguf"),
        ("file", "a/../../x.gguf"),
    ],
)
def test_paths_in_a_users_models_yaml_are_refused_with_file_and_line(cli, sandbox, field, value):
    tmp_path, env = sandbox
    verifier = {"repo": VERIFIER_REPO, "file": "verifier.gguf", field: value}
    registry = {
        "pairs": {
            "evil": {
                "note": "n",
                "license": "mit",
                "recommended_k": 3,
                "verifier": verifier,
                "draft": {"repo": "test/tiny-draft-GGUF", "file": "draft.gguf"},
            }
        }
    }
    path = tmp_path / "root" / "config" / "specgguf" / "models.yaml"
    path.write_text(json.dumps(registry, indent=1))  # JSON is YAML; one key a line
    for command in (["pull", "evil"], ["pairs"], ["pairs", "evil"], ["run", "--pair", "evil", "hi"]):
        result = cli(*command, env=env)
        line = result.error_line()
        assert f"{path}:" in line and f"verifier.{field}" in line and result.returncode == 2, line
    assert files_under(tmp_path / "outside") == set()


@pytest.mark.parametrize("ref", ["t/ok/../../x.gguf", "t/../x/y.gguf", "t/./x/y.gguf"])
def test_an_ad_hoc_reference_with_dot_dot_is_a_clean_error(cli, sandbox, ref):
    tmp_path, env = sandbox
    line = cli("pull", "--verifier", ref, "--draft", "test/tiny-draft-GGUF/draft.gguf", env=env).error_line()
    assert "OWNER/REPO/FILE.gguf" in line
    assert files_under(tmp_path / "outside") == set()


# --- hostile GGUF files -------------------------------------------------------------------
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


def tiny_with(folder: Path, name: str, **kwargs) -> Path:
    return write_tiny_llama(folder / name, base_seed=7, **kwargs)


def test_check_escapes_metadata_from_the_file(cli, hostile_dir, tiny_verifier):
    import gguf

    path = hostile_dir / "escapes.gguf"
    reader = gguf.GGUFReader(tiny_verifier)
    writer = gguf.GGUFWriter(str(path), "llama")
    for field in reader.fields.values():  # copy every key but the name, which gets escape sequences
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.name"):
            continue
        writer.add_key_value(
            field.name,
            field.contents(),
            field.types[0],
            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None,
        )
    writer.add_name(f"evil{ESCAPES}name")
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=list(reversed(tensor.shape.tolist())), raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = cli("check", path, tiny_verifier)
    stdout = result.stdout
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in stdout and "\x07" not in stdout
    assert "evil\\x1b]0;pwned\\x07" in stdout  # shown, escaped


@pytest.mark.parametrize(
    "template, expected",
    [
        ("{{ raise_exception('no system role') }}", "chat template failed (no system role)"),
        ("{% for m in messages %}{{ m.content ", "chat template failed"),
        ("{{ messages.__class__.__mro__ }}", "chat template failed"),
        ("{{ 1 / 0 }}", "chat template failed"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "did not finish"),
    ],
)
def test_a_failing_or_looping_chat_template_is_one_line(cli, hostile_dir, tiny_draft, template, expected, monkeypatch):
    from specgguf.llama import vocab as rendering

    monkeypatch.setattr(rendering, "TEMPLATE_SECONDS", 1.0)  # the loop is stopped all the same, sooner
    path = tiny_with(hostile_dir, f"template-{abs(hash(template))}.gguf", chat_template=template)
    for command in (
        ["run", "-m", path, "-md", tiny_draft, "-c", "128", "hello"],
        ["run", "-m", path, "-c", "128", "-k", "0", "hello"],
    ):
        started = time.monotonic()
        line = cli(*command).error_line()
        assert expected in line and "--raw" in line
        assert time.monotonic() - started < 30
    raw = cli("run", "-m", path, "-c", "128", "--raw", "--temp", "0", "-n", "4", "hello")
    assert raw.returncode == 0, raw.stderr  # --raw sidesteps the template
    chat = cli("chat", "-m", path, "-c", "128", "-q", stdin="hello\n")  # the same rendering
    assert "1 question got no complete answer" in chat.error_line() and expected in chat.stderr


# --- options and input --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_verifier, tiny_draft):
    return ["-m", tiny_verifier, "-md", tiny_draft, "-c", "256", "--temp", "0", "-n", "6"]


def test_seed_minus_one_is_random_and_other_negatives_are_refused(cli, tiny):
    first = json.loads(cli("run", *tiny, "--seed", "-1", "--json", "hi").stdout)
    assert first["settings"]["seed"] >= 0
    for command in ("run", "chat"):
        line = cli(command, *tiny, "--seed", "-5", "hi" if command == "run" else "-q", stdin="hi\n").error_line()
        assert "--seed" in line
    chat = cli("chat", *tiny, "--seed", "-1", "-q", stdin="hello\n")
    assert chat.returncode == 0, chat.stderr


def test_stdin_that_is_not_utf8_is_refused_clearly(cli, tiny):
    line = cli("run", *tiny, stdin=b"hello \xff\xfe binary \x00").error_line()
    assert "not UTF-8" in line and "offset 6" in line


def test_a_prompt_argument_that_is_not_utf8_is_refused_clearly(cli, tiny):
    argument = os.fsdecode(b"caf\xe9")  # what Python makes of the byte in sys.argv
    assert "not UTF-8" in cli("run", *tiny, argument).error_line()


@pytest.mark.parametrize("path", ["models/some/thing.gguf", "a b/c d/e.gguf", "x/y/../z.gguf"])
def test_a_missing_path_with_slashes_says_no_such_file(cli, tiny_draft, path):
    line = cli("run", "-m", path, "-md", tiny_draft, "hi").error_line()
    assert "no such file" in line


def test_closed_stdout_is_one_line(cli, tiny):
    result = cli.process("run", *tiny, "hi", stdout=subprocess.DEVNULL, timeout=60, preexec_fn=lambda: os.close(1))
    assert "standard output is closed" in result.error_line()


def test_threads_beyond_the_usable_cores_are_capped_with_a_warning(cli, tiny):
    result = cli("run", *tiny, "-t", "1000", "--json", "hi")
    assert result.returncode == 0, result.stderr
    assert "-t 1000: only" in result.stderr
    assert json.loads(result.stdout)["settings"]["n_threads"] == len(os.sched_getaffinity(0))


def test_temperature_nan_is_refused_on_the_command_line_and_in_chat(cli, tiny):
    for value in ("nan", "inf"):
        assert "temp" in cli("run", *tiny, "--temp", value, "hi").error_line()
    chat = cli("chat", *tiny, "-q", stdin="/temp nan\n/temp inf\nhello\n")
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("usage: /temp X") == 2


def test_piped_chat_exits_non_zero_when_a_question_failed(cli, tiny):
    long_question = "word " * 400  # more than the 256-token context
    result = cli("chat", *tiny, "-q", stdin=f"{long_question}\nhello\n")
    line = result.error_line()
    assert "1 question got no complete answer" in line
    assert result.stdout.strip()  # the good question was still answered


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        '"text"',
        "{not json",
        '{"MACHINE": []}',
        '{"MACHINE": {"PAIR": {"greedy": {"k": "abc", "speedup": 1.2}}}}',
        '{"MACHINE": {"PAIR": {"greedy": {"speedup": 1.2}}}}',
        '{"MACHINE": {"PAIR": {"greedy": {"k": 4.5, "speedup": 1.2}}}}',
        '{"MACHINE": {"PAIR": {"greedy": {"k": -5, "speedup": 1.2}}}}',
        '{"MACHINE": {"PAIR": {"greedy": {"k": true, "speedup": 1.2}}}}',
        '{"MACHINE": {"PAIR": "greedy"}}',
        '{"MACHINE": {"PAIR": {"greedy": [4]}}}',
    ],
)
def test_a_damaged_tuning_file_is_ignored_with_a_warning(cli, tiny, tiny_verifier, tiny_draft, config_home, content):
    from specgguf.tuning import machine_id, pair_key

    tuning = config_home / "specgguf" / "tuning.json"
    tuning.write_text(
        content.replace("MACHINE", machine_id().replace("\\", "\\\\")).replace(
            "PAIR", pair_key(tiny_verifier, tiny_draft)
        )
    )
    # A new process: a problem with tuning.json is reported once per process.
    result = cli.process("run", *tiny, "-k", "auto", "--json", "hi")
    assert result.returncode == 0, result.stderr
    stderr = result.stderr
    assert "specgguf: warning:" in stderr and "ignored" in stderr and "Traceback" not in stderr
    assert json.loads(result.stdout)["k_source"].startswith("K adaptive")  # not "K=-5"
    assert tuning.read_text().startswith(content[:1])  # reading never rewrites it


def test_storing_into_a_damaged_tuning_file_keeps_what_was_there(config_home):
    from specgguf import tuning

    path = tuning.tuning_path()
    path.write_text("{not json")
    tuning.store_measurement(Path("v.gguf"), Path("d.gguf"), 0.0, tuning.BenchResult(4, 1.3))
    assert path.with_name("tuning.json.damaged").read_text() == "{not json"
    assert tuning.stored_measurement(Path("v.gguf"), Path("d.gguf"), 0.0) == tuning.BenchResult(4, 1.3)
    # An invalid entry beside valid ones: the valid ones survive a write.
    data = json.loads(path.read_text())
    data[tuning.machine_id()]["junk"] = {"greedy": {"k": "abc"}}
    path.write_text(json.dumps(data))
    tuning.store_measurement(Path("w.gguf"), Path("d.gguf"), 0.0, tuning.BenchResult(2, 1.1))
    assert tuning.stored_measurement(Path("v.gguf"), Path("d.gguf"), 0.0) == tuning.BenchResult(4, 1.3)
    assert json.loads(path.read_text())[tuning.machine_id()]["junk"] == {"greedy": {"k": "abc"}}


def test_bench_checks_the_plot_path_before_measuring(cli, tiny_verifier, tiny_draft):
    started = time.monotonic()
    line = cli(
        "bench", "-m", tiny_verifier, "-md", tiny_draft, "--quick", "--plot", "/proc/nope.png", "--no-store"
    ).error_line()
    assert "--plot /proc/nope.png" in line and time.monotonic() - started < 20


# --- Ctrl-C at any moment -----------------------------------------------------------------
def test_ctrl_c_during_start_up_imports_is_exit_130_without_a_traceback(monkeypatch, capsys):
    import importlib.abc

    from specgguf import __main__ as entry

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "specgguf.cli.app":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "specgguf.cli.app", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry.main() == 130
    assert capsys.readouterr().err == "specgguf: error: interrupted\n"


@pytest.mark.parametrize("wrapped", [True, False])
def test_an_interrupt_python_wrapped_in_a_runtime_error_is_still_exit_130(monkeypatch, capsys, wrapped):
    # Python 3.11 re-raises an exception from a class body's __set_name__ as a RuntimeError caused by
    # it (seen in CI: a Ctrl-C during `import platform`, under Typer). Any other RuntimeError is a bug
    # to report, not an interruption.
    import importlib.abc

    from specgguf import __main__ as entry

    class Failing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "specgguf.cli.app":
                cause = KeyboardInterrupt() if wrapped else ValueError("no")
                raise RuntimeError("Error calling __set_name__") from cause
            return None

    monkeypatch.delitem(sys.modules, "specgguf.cli.app", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Failing(), *sys.meta_path])
    if wrapped:
        assert entry.main() == 130
        assert capsys.readouterr().err == "specgguf: error: interrupted\n"
    else:
        with pytest.raises(RuntimeError):
            entry.main()


def test_ctrl_c_while_the_model_loads_stops_with_130(qwen_pair):
    verifier, draft = qwen_pair
    process = subprocess.Popen(
        [*SPECGGUF, "run", "-m", verifier, "-md", draft, "-n", "400", "hi"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SPECGGUF_DEBUG": "1"},
    )
    # llama.cpp's log (echoed with SPECGGUF_DEBUG) says the load has started: interrupt it there.
    seen = b""
    while b"llama_model_loader" not in seen:
        chunk = process.stderr.read1(4096)
        assert chunk, "the process ended before loading"
        seen += chunk
    process.send_signal(signal.SIGINT)
    # (Generous: the load stops at llama.cpp's next progress call, which a cold page cache can delay
    # by tens of seconds; CI once took over 60. A hang still fails.)
    _, rest = process.communicate(timeout=240)
    stderr = (seen + rest).decode("utf-8", "replace")
    assert process.returncode == 130, stderr[-2000:]
    assert "Exception ignored" not in stderr and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "specgguf: error: interrupted"
