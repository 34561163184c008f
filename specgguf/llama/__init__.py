"""llama.cpp, the only wing that imports llama_cpp or ggml: model (LlamaModel, the real Model), template
(a GGUF's chat template), vocab, convert (re-quantizing), compat (can two vocabularies pair), runtime
(llama.cpp's log and Ctrl-C), rpc (workers), rpc_devices, ggml_devices, threads, guidance (the
vocabulary for llguidance's grammars)."""
