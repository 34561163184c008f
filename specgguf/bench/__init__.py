"""Benchmarks: command (`specgguf bench`), measure (interleaved runs), vs_llama (against llama.cpp's
programs), llama_tools (running them)."""
