"""The HTTP server. app (the guards, the API key, /health, /metrics, the page at /, every API's routes,
each error in its API's shape; `run_server`) over two halves that the import contracts keep apart, beside the page:

- apis/: one entry per API, importing none of each other: openai/ (chat and text completions, the
  models list: routes and response shapes; bodies and fields for its request bodies, accepted or refused
  fields), responses/ (OpenAI's Responses), embeddings, anthropic/ (Messages), ollama/
  (chat.py: tools; embed.py: its embedding routes), infill (llama-server's /infill).
- the machinery, which imports no API: common (options, ApiError, body parsing, the sampling reader,
  usage and timings), jobs (submit a job, read its answer whole or as a stream), plan (a request ->
  prompt tokens, constraint, drafter, K policy), generator (the threads that run plans through the
  engine, one per live sequence), embedding_turns (an embedding job's turns on those threads),
  messages (a job and what the threads send it), parallel/ (several clients at once: lanes,
  sizing), text (stop strings, logprobs), line_end (no drafts past FIM's last line), draft_marks (who
  wrote each streamed chunk: an accepted draft or the verifier), tools and tool_syntax (tool
  calling: the lazy grammar, each family's call syntax), cache_slots (several cached conversations),
  transport (body limit, request counts and their Prometheus /metrics, uvicorn, addresses), guard
  (Host, Origin, content type; a one-line log).
- page/: the chat page at / (static index.html, page.css, page.js; routes answers those three
  paths), a client of OpenAI's chat completions that imports no API.
"""
