"""OpenAI's API."""
