"""The HTTP server: app (routes), generator (the one thread that drives the engine), protocol (request
models, errors), shapes (response bodies, events), text (stop strings, logprobs), transport, metrics."""
