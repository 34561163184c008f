"""llama.cpp, the only wing that imports llama_cpp or ggml: backend (the real Model), compat (can two
vocabularies pair), ggml_devices, rpc (workers), threads."""
