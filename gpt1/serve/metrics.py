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
    generations, speculative decoding's drafted and accepted tokens."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = self._counter(
            "gpt1_requests", "HTTP requests by endpoint and status code", "endpoint", "code"
        )
        self.latency = self._histogram(
            "gpt1_request_seconds",
            "Time from request to the last byte of the response, by endpoint",
            LATENCY_BUCKETS,
            "endpoint",
        )
        self.in_flight = self._gauge("gpt1_requests_in_flight", "Requests being handled now")
        self.queued = self._gauge(
            "gpt1_queue_items", "Items (examples, score pairs, generations) waiting for the model"
        )
        self.batch_items = self._histogram(
            "gpt1_batch_items", "Items per model batch, by kind", SIZE_BUCKETS, "kind"
        )
        self.batch_tokens = self._histogram(
            "gpt1_batch_tokens", "Tokens per model batch, by kind", TOKEN_BUCKETS, "kind"
        )
        self.generated = self._counter("gpt1_generated_tokens", "Tokens generated")
        self.draft_tokens = self._counter(
            "gpt1_draft_tokens", "Tokens drafted from a generation's text and verified"
        )
        self.draft_accepted = self._counter(
            "gpt1_draft_accepted", "Drafted tokens accepted (the tokens decoding would choose)"
        )
        self.active_generations = self._gauge(
            "gpt1_active_generations",
            "Generations being decoded now (at most --max-generations; the rest are queued)",
        )

    # Each metric in this app's registry (several apps in one process keep their own).
    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple, *labels: str) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def observe_batch(self, kind: str, items: int, tokens: int) -> None:
        """A model batch of `kind`; kind "draft" (speculative decoding) counts the tokens
        drafted (`items`) and accepted (`tokens`) instead."""
        if kind == "draft":
            self.draft_tokens.inc(items)
            self.draft_accepted.inc(tokens)
            return
        self.batch_items.labels(kind).observe(items)
        self.batch_tokens.labels(kind).observe(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
