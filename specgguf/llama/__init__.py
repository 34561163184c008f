"""llama.cpp, the only wing that imports llama_cpp or ggml: model (LlamaModel, the real Model), tree
(a draft tree's batch layout, kept exact), batcher (several sequences' rows decoded together, and a
view per sequence: serve --parallel), sequences (its llama.cpp decoder, one context of N sequences,
with the filler rows that make one pass of unequal requests), loaded (LoadedModel, what the rest
uses of one, and ModelSettings, how a file loads), vocab (a GGUF's vocabulary and chat template), info
(description, FIM tokens), embedding, state (saved caches), convert (re-quantizing) and variants
(the drafts it can make, by name), compat (can two vocabularies pair), runtime (llama.cpp's log,
Ctrl-C and the one decode thread), stops (a request stopped between or inside its passes), rpc
(workers), rpc_devices, ggml_devices, rpc_frames, rpc_relay and rpc_child (the worker's relay and
its child server), threads, guidance (the vocabulary for llguidance's grammars), huge_pages (llama.cpp's buffers in
2 MiB pages: what `__main__` starts the program again with, and how a model is read)."""
