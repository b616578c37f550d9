"""The server's Prometheus metrics (`GET /metrics`, the text format every scraper reads).

A registry per app, so several apps in one process (tests) do not share counters.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    """Request counts and latencies per endpoint and status, batch sizes, queue depth, active
    generations."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpt1_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "gpt1_request_seconds",
            "Time from request to the last byte of the response, by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("gpt1_requests_in_flight", "Requests being handled now", registry=r)
        self.queued = Gauge(
            "gpt1_queue_items",
            "Items (examples, score pairs, generations) waiting for the model",
            registry=r,
        )
        self.batch_items = Histogram(
            "gpt1_batch_items",
            "Items per model batch, by kind",
            ["kind"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "gpt1_batch_tokens",
            "Tokens per model batch, by kind",
            ["kind"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.generated = Counter("gpt1_generated_tokens", "Tokens generated", registry=r)
        self.active_generations = Gauge(
            "gpt1_active_generations",
            "Generations being decoded now (at most --max-generations; the rest are queued)",
            registry=r,
        )

    def observe_batch(self, kind: str, items: int, tokens: int) -> None:
        self.batch_items.labels(kind).observe(items)
        self.batch_tokens.labels(kind).observe(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
