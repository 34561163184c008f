"""The HTTP server: app (OpenAI routes, error shapes), generator (the one thread that drives the
engine), jobs (submit and read a job), protocol and openai_fields (request models, errors), shapes
(response bodies, events), text (stop strings, logprobs), one module per other API (ollama,
anthropic, responses, infill, embeddings), cache_slots (several cached conversations), transport,
metrics."""
