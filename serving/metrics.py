"""The service's Prometheus metrics, in a registry of its own (two apps in one process never collide)."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)  # seconds; batch-1 ONNX is µs-ms


class Metrics:
    """Requests by variant, version and status; latency by variant; the version behind each alias; reloads.
    Each labelled child is looked up once and kept: `labels()` costs a lock and a dict build per call."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("torchship_requests", "Prediction requests", ["variant", "version", "status"],
                                registry=self.registry)
        self.latency = Histogram("torchship_request_seconds", "Prediction latency", ["variant"],
                                 registry=self.registry, buckets=LATENCY_BUCKETS)
        self.version = Gauge("torchship_model_version", "Version behind each alias", ["alias"], registry=self.registry)
        self.reloads = Counter("torchship_model_reloads", "Alias moves picked up", ["alias"], registry=self.registry)
        self._counters: dict[tuple[str, str, str], Counter] = {}
        self._latencies: dict[str, Histogram] = {}

    def counter(self, variant: str, version: str, status: str) -> Counter:
        """The request counter of one (variant, version, status)."""
        key = (variant, version, status)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = self.requests.labels(variant, version, status)
        return child

    def latency_of(self, variant: str) -> Histogram:
        child = self._latencies.get(variant)
        if child is None:
            child = self._latencies[variant] = self.latency.labels(variant)
        return child

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
