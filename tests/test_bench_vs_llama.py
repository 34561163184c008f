"""`specgguf bench --vs-llama-cpp DIR`: llama.cpp's own programs next to ours.

The comparison itself runs the real llama.cpp programs, found in $SPECGGUF_LLAMA_CPP_BIN, else
build/llama.cpp/bin (`make llama-tools`), else /tmp/llama-build/bin; it is skipped, saying so,
where none is built. Bad input and the handling of the programs (failure, silence, overrun,
Ctrl-C) need no llama.cpp build: small shell scripts stand in for the programs.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from specgguf.bench import llama_tools
from specgguf.bench.llama_tools import LlamaTools, ToolSettings, run_plain
from specgguf.bench.vs_tables import ratio_table, speed_table
from specgguf.cli.app import main
from specgguf.core.sampling import SamplingSettings
from specgguf.errors import SpecggufError

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = ("llama-completion", "llama-speculative-simple")


def llama_cpp_bin() -> Path:
    named = os.environ.get("SPECGGUF_LLAMA_CPP_BIN")
    candidates = [Path(named)] if named else [REPO / "build" / "llama.cpp" / "bin", Path("/tmp/llama-build/bin")]
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in PROGRAMS):
            return directory
    pytest.skip(
        f"llama.cpp's programs are not built in {' or '.join(map(str, candidates))}"
        " (`make llama-tools`, or set SPECGGUF_LLAMA_CPP_BIN)"
    )


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def fake_programs(directory: Path, script: str) -> Path:
    """Both programs as one shell script (what it does is up to the test)."""
    directory.mkdir(exist_ok=True)
    for name in PROGRAMS:
        path = directory / name
        path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
        path.chmod(0o755)
    return directory


# --- bad input: one line, exit status 2, before any model loads --------------------------------


def test_a_missing_directory_or_program_is_one_clear_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "--vs-llama-cpp", tmp_path / "nowhere", "-m", "v.gguf", "-md", "d.gguf")
    assert code == 2 and out == ""
    assert err == (
        f"specgguf: error: --vs-llama-cpp {tmp_path / 'nowhere'}: not a directory (build llama.cpp's"
        " tools as docs/llama-cpp.md says, e.g. `make llama-tools`)\n"
    )
    (tmp_path / "llama-completion").write_text("")
    (tmp_path / "llama-completion").chmod(0o755)
    code, _, err = run_cli(capsys, "bench", "--vs-llama-cpp", tmp_path, "-m", "v.gguf", "-md", "d.gguf")
    assert code == 2 and err.startswith("specgguf: error: ") and "no llama-speculative-simple there" in err
    (tmp_path / "llama-speculative-simple").write_text("")  # there, but not executable
    code, _, err = run_cli(capsys, "bench", "--vs-llama-cpp", tmp_path, "-m", "v.gguf", "-md", "d.gguf")
    assert code == 2
    assert err == f"specgguf: error: --vs-llama-cpp {tmp_path}: llama-speculative-simple is not executable\n"


@pytest.mark.parametrize("option", [["--drafters", "ngram"], ["--no-adaptive"], ["--plot", "x.png"], ["--temps", ""]])
def test_options_that_do_not_apply_are_refused(capsys, tmp_path, option):
    directory = fake_programs(tmp_path / "bin", "exit 0\n")
    code, out, err = run_cli(capsys, "bench", "--vs-llama-cpp", directory, *option, "-m", "v.gguf", "-md", "d.gguf")
    assert code == 2 and out == "" and err.startswith("specgguf: error: ") and err.count("\n") == 1


# --- the programs, as processes ----------------------------------------------------------------

SETTINGS = ToolSettings(n_threads=1, n_ctx=256, max_tokens=8, sampling=SamplingSettings(temperature=0.8), seed=7)


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_program_that_fails_or_prints_no_timings_is_named_with_its_log(tmp_path):
    tools = LlamaTools.find(fake_programs(tmp_path / "failing", "printf 'error: \\033[31mbad model\\n' >&2; exit 3\n"))
    with pytest.raises(
        SpecggufError,
        match=r"llama-completion failed \(exit status 3\); its log ends: "
        r"error: \\x1b\[31mbad model$",
    ):
        run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    tools = LlamaTools.find(fake_programs(tmp_path / "silent", "echo 'eval time = 5 ms / 3 runs' ; exit 0\n"))
    # The answer (stdout) is never read as a timing line.
    with pytest.raises(SpecggufError, match="llama-completion printed no timing lines"):
        run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_each_program_gets_our_settings_no_stdin_and_its_own_libraries(tmp_path, monkeypatch):
    record = tmp_path / "record"
    tools = LlamaTools.find(
        fake_programs(
            tmp_path / "bin",
            f"""\
        printf '%s\\n' "$@" > {record}.args
        cat > {record}.stdin
        env > {record}.env
        echo 'common_perf_print:    sampling time =      10.00 ms' >&2
        echo 'common_perf_print: prompt eval time =      50.00 ms /    12 tokens (1 ms per token)' >&2
        echo 'common_perf_print:        eval time =     190.00 ms /     7 runs   (27 ms per token)' >&2
        """,
        )
    )
    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "999")  # llama.cpp reads these: they must not leak in
    run = run_plain(tools, model=Path("m.gguf"), prompt="line one\\nline two\n", settings=SETTINGS)
    assert (run.n_prompt, run.n_tokens, run.seconds) == (12, 7, pytest.approx(0.2))
    assert run.tokens_per_second == pytest.approx(35.0)
    arguments = (tmp_path / "record.args").read_text()
    assert "-p\nline one\\nline two\n\n-no-cnv\n" in arguments  # the text as is: no escapes, no template
    for pair in (
        "-t\n1",
        "-tb\n1",
        "-c\n256",
        "-n\n8",
        "--temp\n0.8",
        "--top-k\n40",
        "--top-p\n0.95",
        "--min-p\n0.05",
        "--samplers\ntop_k;top_p;min_p;temperature",
        "--seed\n7",
    ):
        assert f"\n{pair}\n" in arguments
    assert (tmp_path / "record.stdin").read_text() == ""
    environment = (tmp_path / "record.env").read_text()
    assert f"LD_LIBRARY_PATH={tools.directory}" in environment and "LLAMA_ARG_" not in environment


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
@pytest.mark.parametrize("same_pages", [False, True])
def test_llama_cpp_gets_the_pages_users_give_it_or_with_the_option_ours(tmp_path, monkeypatch, same_pages):
    from specgguf.llama import huge_pages

    record = tmp_path / "record.env"
    script = f"""env > {record}
echo 'common_perf_print:    sampling time =      10.00 ms' >&2
echo 'common_perf_print: prompt eval time =      50.00 ms /    12 tokens (1 ms per token)' >&2
echo 'common_perf_print:        eval time =     190.00 ms /     7 runs   (27 ms per token)' >&2
"""
    tools = LlamaTools.find(fake_programs(tmp_path / "bin", script), same_pages=same_pages)
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "glibc_version", lambda: (2, 36))
    # as this program has it once started again (llama/huge_pages.py), beside a tunable of the user's
    monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.pthread.rseq=0:{huge_pages.TUNABLE}")
    monkeypatch.setenv(huge_pages.SWITCH, huge_pages.ADDED)
    run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    environment = record.read_text().splitlines()
    if same_pages:
        assert f"GLIBC_TUNABLES=glibc.pthread.rseq=0:{huge_pages.TUNABLE}" in environment
        assert f"{huge_pages.LOAD_MODE}=none" in environment
    else:
        assert "GLIBC_TUNABLES=glibc.pthread.rseq=0" in environment  # the user's, without ours
        assert not [line for line in environment if line.startswith((huge_pages.SWITCH, "LLAMA_ARG_"))]


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_program_that_overruns_is_stopped(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    tools = LlamaTools.find(fake_programs(tmp_path / "bin", f"echo $$ > {pid_file}; exec sleep 60\n"))
    monkeypatch.setattr(llama_tools, "RUN_SECONDS", 0.1)
    monkeypatch.setattr(llama_tools, "SECONDS_PER_TOKEN", 0.05)  # -n 8: 0.5 s
    with pytest.raises(SpecggufError, match=r"llama-completion ran past 0.5 s; stopped it"):
        run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_the_limit_scales_with_the_tokens_asked_for():
    assert llama_tools.run_limit(8) < llama_tools.run_limit(128) < llama_tools.run_limit(1024)
    assert llama_tools.run_limit(128) < 900  # the old flat limit: a hung program was 15 silent minutes


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_program_that_overruns_is_stopped_with_its_children(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    script = f"sleep 60 & echo $! > {pid_file}; exec sleep 60\n"
    tools = LlamaTools.find(fake_programs(tmp_path / "bin", script))
    monkeypatch.setattr(llama_tools, "RUN_SECONDS", 0.5)
    monkeypatch.setattr(llama_tools, "SECONDS_PER_TOKEN", 0.0)
    with pytest.raises(SpecggufError, match=r"ran past 0.5 s"):
        run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    assert_gone(int(pid_file.read_text()))


TIMINGS = (
    "common_perf_print:    sampling time =      {sampling} ms\n"
    "common_perf_print: prompt eval time =     12.5 ms /    30 tokens\n"
    "common_perf_print:        eval time =    {eval} ms /   {runs} runs\n"
)


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as stat:  # a zombie (not yet reaped by init) is gone too
            if stat.read().split()[2] == "Z":
                return
        assert time.monotonic() < deadline, f"process {pid} is still running"
        time.sleep(0.05)


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_background_child_holding_the_log_open_is_not_waited_for(tmp_path):
    pid_file = tmp_path / "pid"
    timings = TIMINGS.format(sampling="1.0", eval="100.0", runs="7")
    script = f"sleep 60 >&2 & echo $! > {pid_file}\nprintf '{timings}' >&2\nexit 0\n"
    tools = LlamaTools.find(fake_programs(tmp_path / "bin", script))
    started = time.monotonic()
    run = run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    assert time.monotonic() - started < 10 and run.n_tokens == 7
    assert_gone(int(pid_file.read_text()))  # and it is not left running after us


@pytest.mark.parametrize(
    "sampling, eval_ms, runs, what",
    [
        ("0.0", "0.00", "7", "eval time"),
        ("1.0", "1.2.3", "7", "eval time"),
        ("1.2.3", "100.0", "7", "sampling time"),
        ("1.0", "100.0", "0", "number of runs"),
        ("1.0", "9" * 400, "7", "eval time"),  # overflows to inf
    ],
)
def test_zero_seconds_or_malformed_numbers_are_one_error(tmp_path, sampling, eval_ms, runs, what):
    from specgguf.bench.llama_tools import parse_completion, parse_speculative

    with pytest.raises(SpecggufError, match=f"llama-completion reported its {what}"):
        parse_completion(TIMINGS.format(sampling=sampling, eval=eval_ms, runs=runs))
    for decoded in (
        "decoded 9 tokens in 0.000 seconds",
        "decoded 9 tokens in 1..5 seconds",
        "decoded 0 tokens in 1.5 seconds",
    ):
        with pytest.raises(SpecggufError, match="llama-speculative-simple reported its"):
            parse_speculative(f"encoded 30 tokens in 0.1 seconds\n{decoded}\n")


def test_bench_with_a_program_reporting_zero_seconds_is_one_line(cli, tmp_path, tiny_verifier, tiny_draft):
    timings = TIMINGS.format(sampling="0.0", eval="0.000", runs="4")
    directory = fake_programs(tmp_path / "bin", f"printf '{timings}' >&2\nexit 0\n")
    line = cli(
        "bench", "--vs-llama-cpp", directory, "-m", tiny_verifier, "-md", tiny_draft, "-n", "4", "-k", "2",
        "--temps", "0", "--prompts", "code", "--repeats", "1", "-t", "1",
    ).error_line()  # fmt: skip
    assert "llama-completion reported its eval time as '0.000'" in line


@pytest.mark.live  # the code under test starts a program (tests/kinds.py)
def test_a_huge_log_is_one_capped_error_line(tmp_path):
    script = "head -c 2000000 /dev/zero | tr '\\0' x >&2\nexit 1\n"
    tools = LlamaTools.find(fake_programs(tmp_path / "bin", script))
    with pytest.raises(SpecggufError) as raised:
        run_plain(tools, model=Path("m.gguf"), prompt="hi", settings=SETTINGS)
    message = str(raised.value)
    assert message.startswith("llama-completion failed (exit status 1)") and len(message) < 800
    assert "\n" not in message


def test_ctrl_c_stops_the_running_program_too(tmp_path, tiny_verifier, tiny_draft):
    pid_file = tmp_path / "pid"
    directory = fake_programs(tmp_path / "bin", f"echo $$ > {pid_file}; exec sleep 60\n")
    command = [
        sys.executable,
        "-m",
        "specgguf",
        "bench",
        "--vs-llama-cpp",
        str(directory),
        "-m",
        str(tiny_verifier),
        "-md",
        str(tiny_draft),
        "-n",
        "4",
        "-k",
        "2",
        "--temps",
        "0",
        "--prompts",
        "code",
        "--repeats",
        "1",
        "-t",
        "1",
    ]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text().strip()) and process.poll() is None:
            assert time.monotonic() < deadline, "the fake llama-completion never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and err.endswith("specgguf: error: interrupted\n"), err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


# --- the real comparison ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def comparison(smollm2):
    directory = llama_cpp_bin()
    # SmolLM2 drafts for itself: small and fast; what is checked is the plumbing, not the speeds.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "specgguf",
            "bench",
            "--vs-llama-cpp",
            str(directory),
            "-m",
            str(smollm2),
            "-md",
            str(smollm2),
            "-n",
            "8",
            "-k",
            "2",
            "--temps",
            "0,0.8",
            "--prompts",
            "code,prose",
            "--repeats",
            "1",
            "-t",
            "1",
            "--json",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_both_sides_run_every_prompt_and_temperature_on_the_same_prompt_tokens(comparison):
    assert comparison["threads"] == 1 and comparison["ks"] == [2] and comparison["max_tokens"] == 8
    (result,) = comparison["results"]
    assert [(c["prompt"], c["temperature"]) for c in result["cells"]] == [
        ("code", 0.0),
        ("code", 0.8),
        ("prose", 0.0),
        ("prose", 0.8),
    ]
    for cell in result["cells"]:
        assert list(cell["tokens_per_second"]) == [
            "llama.cpp plain",
            "llama.cpp K=2",
            "specgguf plain",
            "specgguf default",
            "specgguf K=2",
        ]
        for label, (run,) in cell["runs"].items():
            assert run["n_tokens"] > 0 and run["seconds"] > 0, label
            if label.startswith("llama.cpp"):  # it read our rendered chat template as the same tokens
                assert run["n_prompt"] == result["prompt_tokens"][cell["prompt"]] > 10
        for label in ("llama.cpp K=2", "specgguf K=2"):
            (run,) = cell["runs"][label]
            assert run["n_drafted"] > 0 and 0 <= run["n_accepted"] <= run["n_drafted"]
        (plain,) = cell["runs"]["llama.cpp plain"]
        assert plain["n_drafted"] is None and 0 < plain["n_tokens"] <= 8


def test_ratios_are_the_ratios_of_the_medians_shown(comparison):
    for cell in comparison["results"][0]["cells"]:
        speed, ratios = cell["tokens_per_second"], cell["ratios"]
        assert cell["llama_cpp_best_k"] == 2
        assert ratios["default / llama.cpp plain"] == pytest.approx(
            speed["specgguf default"] / speed["llama.cpp plain"], abs=2e-3
        )
        assert ratios["default / llama.cpp best K"] == pytest.approx(
            speed["specgguf default"] / speed["llama.cpp K=2"], abs=2e-3
        )
        assert ratios["K=2 / llama.cpp K=2"] == pytest.approx(speed["specgguf K=2"] / speed["llama.cpp K=2"], abs=2e-3)
        assert ratios["default / plain"] == pytest.approx(speed["specgguf default"] / speed["specgguf plain"], abs=2e-3)
        assert cell["kind"] == cell["prompt"]  # bench's own prompts are their own kind
    worst = comparison["results"][0]["worst"]["default / llama.cpp plain"]
    lowest = min(c["ratios"]["default / llama.cpp plain"] for c in comparison["results"][0]["cells"])
    assert worst["ratio"] == lowest and worst["prompt"] in ("code", "prose")


def test_the_tables_show_every_column_and_ratio(comparison):
    console = Console(width=200, record=True, file=io.StringIO())
    (result,) = comparison["results"]
    console.print(speed_table(result, comparison))
    console.print(ratio_table(result))
    text = console.export_text()
    assert "tok/s, -n 8, -t 1, median of 1" in text
    for header in (
        "llama.cpp plain",
        "llama.cpp K=2",
        "specgguf plain",
        "specgguf default",
        "specgguf K=2",
        "default / llama.cpp plain",
        "default / llama.cpp best K",
        "K=2 / llama.cpp K=2",
        "plain / llama.cpp plain",
        "default / plain",
    ):
        assert header in text
    first = result["cells"][0]
    assert f"{first['tokens_per_second']['llama.cpp plain']:.2f}" in text
    assert f"{first['ratios']['default / llama.cpp plain']:.2f}×" in text
    assert f"{first['ratios']['default / llama.cpp best K']:.2f}× (K=2)" in text


# --- each side alone ----------------------------------------------------------------------------


def test_llama_cpp_runs_while_our_models_are_closed_and_ours_get_them_back(
    cli, tmp_path, monkeypatch, tiny_verifier, tiny_draft
):
    """A process holding the model loaded changed the other side's decoding speed (our_side.py): while a
    llama.cpp program runs, this process maps neither model file; our columns still run, on models loaded again."""
    from specgguf.bench import vs_llama
    from specgguf.bench.llama_tools import ToolRun
    from specgguf.llama.model import LlamaModel

    # The prompt's tokens as llama.cpp would count them, from a copy of the file (this process maps the copy).
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_verifier.read_bytes())
    tokenizer = LlamaModel(copy, n_ctx=64, n_threads=1)
    held: list[bool] = []

    def fake_run(target, tools, column, text, settings):
        maps = Path("/proc/self/maps").read_text()
        held.append(str(tiny_verifier) in maps or str(tiny_draft) in maps)
        n_prompt = len(tokenizer.tokenize(text))
        return ToolRun(n_prompt=n_prompt, n_tokens=4, seconds=0.5, n_drafted=2 if column.k else None, n_accepted=1)

    monkeypatch.setattr(vs_llama, "_llama_run", fake_run)
    try:
        result = cli(
            "bench", "--vs-llama-cpp", fake_programs(tmp_path / "bin", "exit 0\n"), "-m", tiny_verifier,
            "-md", tiny_draft, "-n", "4", "-k", "2", "--temps", "0", "--prompts", "code,edit", "--repeats", "2",
            "-t", "1", "--json", "--no-store",
        )  # fmt: skip
    finally:
        tokenizer.close()
    assert result.returncode == 0, result.stderr
    assert held == [False] * 8  # 2 prompts x 2 repeats x (plain, K 2), none beside our models
    cells = json.loads(result.stdout)["results"][0]["cells"]
    assert len(cells) == 2
    for cell in cells:
        assert set(cell["tokens_per_second"]) >= {"specgguf plain", "specgguf K=2", "specgguf default"}
        assert all(len(runs) == 2 for runs in cell["runs"].values())
