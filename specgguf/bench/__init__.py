"""Benchmarks: command (`specgguf bench`), measure (interleaved runs), vs_llama (against llama.cpp's
programs), our_side (our models, loaded only while our columns run) and vs_tables (its tables),
llama_tools (running them), suite (the suite of prompts, suite/), machine (the CPU and llama-bench's
verify curve), traces (replayable client traces, traces/), trace_servers, trace_replay and trace_report
(replaying them against specgguf serve and llama-server)."""
