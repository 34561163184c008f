"""The HTTP server: app (routes), generator (the one thread that drives the engine), protocol (request
models, errors), shapes (response bodies, events), text (stop strings, logprobs), transport, metrics,
tools (tool calling: checks, the lazy grammar, the calls streamed), tool_syntax (each family's call syntax)."""
