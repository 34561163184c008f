"""The HTTP server: app (OpenAI routes, error shapes), generator (the one thread that drives the
engine), jobs (submit and read a job), protocol and openai_fields (request models, errors), shapes
(response bodies, events), text (stop strings, logprobs), tools and tool_syntax (tool calling: checks,
the lazy grammar, each family's call syntax), one module per other API (ollama, anthropic, responses,
infill, embeddings), cache_slots (several cached conversations), transport, guard, metrics."""
