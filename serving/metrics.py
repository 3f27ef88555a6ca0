"""The service's Prometheus metrics, in a registry of its own (two apps in one process never collide).

What the dashboard and the alert rules read (serving/observability.py builds both from these names):
- `torchship_requests_total{variant, version, status}`: /predict answers; status ok | invalid (422/400) |
  too-large (413) | unavailable (503: no champion) | error (500) | shadow-error (the shadow variant failed; the
  request itself was answered). Requests refused before a variant was picked carry variant "-".
- `torchship_request_seconds{variant}`: time from arrival to the answer's body, per answering variant.
- `torchship_predictions_total{variant, label}`: predicted labels (one per served row): the live prediction
  distribution per variant.
- `torchship_model_version{alias}`, `torchship_model_reloads_total{alias}`,
  `torchship_model_load_failures_total{alias}`: what serves, and alias moves picked up or refused.
- `torchship_champion_unblessed`: 1 while the champion is a version bless did not pass, or one rejected (a
  person moved it there by hand: it serves, and a ticket says so).
- `torchship_drift_share`, `torchship_drift_detected`, `torchship_drift_checked_timestamp_seconds`: the newest
  `torchship monitor` verdict (data/monitor/latest.json), read when scraped: the monitor is a batch job, so the
  service exposes its result instead of a pushgateway holding it.
- `torchship_estimated_accuracy`, `torchship_estimated_accuracy_drop`: the same verdict's label-free estimate of
  accuracy (tasks/monitoring/estimate.py) and how far it lies below the champion's holdout accuracy; absent when
  the window's log carried no probabilities.
"""
from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tasks.core import paths
from tasks.registry.read import CHALLENGER, CHAMPION

# seconds; batch-1 ONNX is µs-ms. Up to 5 s so an SLO of a few seconds still has a bucket above it.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 5.0)
SERVING_STATUSES = ("ok", "invalid", "too-large", "unavailable", "error")   # shadow-error is not an answer
FAILED_STATUSES = ("error", "unavailable")   # the service's fault: what the error-rate SLO counts


class DriftCollector:
    """The monitor's newest verdict as gauges, read from its summary at scrape time (re-parsed only when the file
    changed); nothing is exported before a first `torchship monitor`."""

    def __init__(self, report: Path):
        self.report = Path(report)
        self._seen: tuple[float, list] = (-1.0, [])

    def collect(self):
        try:
            mtime = self.report.stat().st_mtime
        except OSError:
            return []
        if mtime != self._seen[0]:
            self._seen = (mtime, self._families(mtime))
        return self._seen[1]

    def _families(self, mtime: float) -> list:
        try:
            summary = json.loads(self.report.read_text())
            share = float(summary["findings"]["drifted_share"])
            detected = 1.0 if summary["gate"]["status"] == "fail" else 0.0
            estimate = summary["findings"].get("estimate")
            estimated = (float(estimate["accuracy"]), float(estimate["drop"])) if estimate else None
        except (OSError, ValueError, KeyError, TypeError):   # half-written or another format: export nothing
            return []
        families = [GaugeMetricFamily("torchship_drift_share", "Share of features drifted in the newest monitor "
                                      "window (torchship monitor)", value=share),
                    GaugeMetricFamily("torchship_drift_detected", "1 when the newest monitor window failed the drift "
                                      "gate", value=detected),
                    GaugeMetricFamily("torchship_drift_checked_timestamp_seconds", "When the newest monitor verdict "
                                      "was written (unix time)", value=mtime)]
        if estimated:
            families += [GaugeMetricFamily("torchship_estimated_accuracy", "Label-free estimate of accuracy on the "
                                           "newest monitor window (the chance each served answer is right, from "
                                           "its probability)",
                                           value=estimated[0]),
                         GaugeMetricFamily("torchship_estimated_accuracy_drop", "The champion's holdout accuracy "
                                           "minus the estimate (monitor.max_estimated_drop)", value=estimated[1])]
        return families


class LabelCounts:
    """Predicted labels per variant as plain ints, exported as the counter `torchship_predictions_total` when
    scraped: a prometheus_client Counter takes a lock per increment (~1.3 µs here, on every request). Increments
    come from the event loop (and rarely a thread-pool body; a lost increment there would skew a distribution by
    one row, never an SLO)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, variant: str, labels: list[str]) -> None:
        counts = self.counts.get(variant)
        if counts is None:
            counts = self.counts[variant] = {}
        for label in labels:
            counts[label] = counts.get(label, 0) + 1

    def collect(self):
        family = CounterMetricFamily("torchship_predictions", "Predicted labels, one per served row",
                                     labels=["variant", "label"])
        for variant, counts in list(self.counts.items()):
            for label, n in list(counts.items()):
                family.add_metric([variant, label], n)
        return [family]


class Metrics:
    """Requests by variant, version and status; latency by variant; predicted labels by variant; the version
    behind each alias; reloads and refused loads; the monitor's drift verdict.
    Each labelled child is looked up once and kept: `labels()` costs a lock and a dict build per call."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, drift_report: Path | None = paths.MONITOR_LATEST) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("torchship_requests", "Prediction requests", ["variant", "version", "status"],
                                registry=self.registry)
        self.latency = Histogram("torchship_request_seconds", "Prediction latency", ["variant"],
                                 registry=self.registry, buckets=LATENCY_BUCKETS)
        self.predictions = LabelCounts()
        self.registry.register(self.predictions)
        self.version = Gauge("torchship_model_version", "Version behind each alias", ["alias"], registry=self.registry)
        self.reloads = Counter("torchship_model_reloads", "Alias moves picked up", ["alias"], registry=self.registry)
        self.load_failures = Counter("torchship_model_load_failures", "Versions refused or failing to load (the "
                                     "current one kept serving)", ["alias"], registry=self.registry)
        self.champion_unblessed = Gauge("torchship_champion_unblessed", "1 while the champion is a version bless "
                                        "did not pass or one rejected (moved by hand)", registry=self.registry)
        for alias in (CHAMPION, CHALLENGER):   # a 0 from the start: increase() sees the first failure
            self.reloads.labels(alias)
            self.load_failures.labels(alias)
        if drift_report is not None:
            self.registry.register(DriftCollector(drift_report))
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
