"""`GET /metrics`: Prometheus text exposition, through prometheus_client (its own registry per server)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, queue_length: Callable[[], int]):
        disable_created_metrics()  # no `*_created` samples: they double the output and say little here
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "specgguf_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "specgguf_prompt_tokens", "Prompt tokens of finished generations", registry=registry
        )
        self.prompt_tokens_cached = Counter(
            "specgguf_prompt_tokens_cached", "Prompt tokens the verifier's KV cache already held", registry=registry
        )
        self.generated = Counter("specgguf_tokens_generated", "Tokens generated", registry=registry)
        self.drafted = Counter("specgguf_tokens_drafted", "Draft tokens proposed", registry=registry)
        self.accepted = Counter("specgguf_tokens_accepted", "Draft tokens the verifier accepted", registry=registry)
        self.drafted_at = Counter(
            "specgguf_drafts_by_position",
            "Draft tokens proposed at each position of a step (0 = first)",
            ["position"],
            registry=registry,
        )
        self.accepted_at = Counter(
            "specgguf_drafts_accepted_by_position",
            "Draft tokens accepted at each position; divide by specgguf_drafts_by_position for acceptance",
            ["position"],
            registry=registry,
        )
        queue_gauge = Gauge("specgguf_queue_length", "Requests waiting for the worker", registry=registry)
        queue_gauge.set_function(queue_length)
        self.first_token = Histogram(
            "specgguf_time_to_first_token_seconds",
            "From a request's arrival to its first generated token (queueing and prompt included)",
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tokens_per_second = Histogram(
            "specgguf_tokens_per_second",
            "Generation speed per request (prompt excluded)",
            registry=registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
        )

    def observe(self, finished) -> None:
        """One generation's totals (a `generator.Finished`); called from the worker thread."""
        stats = finished.stats
        self.prompt_tokens.inc(finished.n_prompt)
        self.prompt_tokens_cached.inc(finished.n_cached)
        self.generated.inc(stats.n_tokens)
        self.drafted.inc(stats.n_drafted)
        self.accepted.inc(stats.n_accepted)
        for position, (n_drafted, n_accepted) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
            self.drafted_at.labels(str(position)).inc(n_drafted)
            self.accepted_at.labels(str(position)).inc(n_accepted)
        if finished.first_token_seconds is not None:
            self.first_token.observe(finished.first_token_seconds)
        if stats.wall_seconds > 0 and stats.n_tokens:
            self.tokens_per_second.observe(stats.tokens_per_second)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
