"""bless, stage 2, performance: batch-1 latency, batch throughput and file size of the candidate and the champion,
measured in the same process and interleaved (tasks/core/timing.py: the noise of a shared machine hits both), with
the machine and its load beside the figures. Never compared with figures from another run.

A timing refusal stands only when the whole interval of the figure lies beyond its limit (resampled by blocks
timed side by side), in a first measurement and in a second one."""
from __future__ import annotations

import numpy as np

from tasks.core.gate import GateResult
from tasks.core.machine import describe_load
from tasks.core.timing import Timings, p99_interval, p99_ratio_interval
from tasks.core.verdicts import StageReport


def summarize_timings(timings: Timings, sizes: dict[str, int], resamples: int,
                      confidence: float) -> dict[str, dict[str, float]]:
    """{model: p50_ms, p99_ms, p99_low_ms, p99_high_ms, mean_ms, rows_per_s, bytes}."""
    figures = {}
    for name, values in timings.latencies_us.items():
        p99 = p99_interval(values, resamples, confidence)
        figures[name] = {"p50_ms": float(np.percentile(values, 50)) / 1e3,
                         "p99_ms": p99["value"] / 1e3, "p99_low_ms": p99["low"] / 1e3, "p99_high_ms": p99["high"] / 1e3,
                         "mean_ms": float(values.mean()) / 1e3, "rows_per_s": timings.rows_per_s[name],
                         "bytes": sizes[name]}
    return figures


def judge_performance(figures: dict[str, dict[str, float]], ratio: dict[str, float] | None, p99_ms: float,
                      max_ratio: float, load: str = "") -> GateResult:
    """Pure core: fail when the candidate's batch-1 p99 exceeds the service's p99 objective with its whole interval
    beyond it, or exceeds the champion's (same run) by more than `max_ratio` with the ratio's whole interval
    beyond it. `ratio`: {value, low, high} of candidate p99 / champion p99 (None without a champion)."""
    candidate = figures["candidate"]
    spread = f"interval {candidate['p99_low_ms']:.2f}-{candidate['p99_high_ms']:.2f} ms"
    box = f"; {load}" if load else ""
    failures = []
    if candidate["p99_ms"] > p99_ms and candidate["p99_low_ms"] > p99_ms:
        failures.append(f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms ({spread}) exceeds slo.p99_ms {p99_ms:g} "
                        f"before any HTTP is added{box}")
    if ratio and ratio["value"] > max_ratio and ratio["low"] > max_ratio:
        failures.append(f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms is {ratio['value']:.1f}x the champion's "
                        f"{figures['champion']['p99_ms']:.2f} ms (interval {ratio['low']:.1f}-{ratio['high']:.1f}x, "
                        f"same run; bless.max_latency_ratio {max_ratio:g}){box}")
    passed = f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms within slo.p99_ms {p99_ms:g}" + (
        f", {ratio['value']:.2f}x the champion's (interval {ratio['low']:.2f}-{ratio['high']:.2f}x; "
        f"bless.max_latency_ratio {max_ratio:g})" if ratio else "") + box
    return GateResult.decide("performance", failures, passed=passed)


def describe_figures(figures: dict[str, dict[str, float]]) -> str:
    """One line: batch-1 p50/p99, rows/s and size per model."""
    return "; ".join(f"{name} p50 {f['p50_ms']:.3f} ms, p99 {f['p99_ms']:.3f} ms, {f['rows_per_s']:,.0f} rows/s, "
                     f"{f['bytes'] / 1024:,.0f} KiB" for name, f in figures.items())


def assess_performance(timings: Timings, sizes: dict[str, int], machine: dict, batch_size: int, p99_ms: float,
                       max_ratio: float, load: dict | None = None, resamples: int = 1000,
                       confidence: float = 0.95) -> StageReport:
    """Pure core of the performance stage: the figures and their intervals, the gate, the report. `load`: the
    machine's load while timing (tasks/core/machine.py), recorded beside the figures and named in the reasons."""
    figures = summarize_timings(timings, sizes, resamples, confidence)
    latencies = timings.latencies_us
    ratio = p99_ratio_interval(latencies["candidate"], latencies["champion"], resamples, confidence) \
        if "champion" in latencies else None
    gate = judge_performance(figures, ratio, p99_ms, max_ratio, describe_load(load) if load is not None else "")
    details = {"models": figures, "batch_size": batch_size, "calls": {k: len(v) for k, v in latencies.items()},
               "machine": machine, "load": load or {}}
    if ratio:
        details["p99_ratio"] = ratio["value"]
        details["p99_ratio_interval"] = ratio
        details["p50_ratio"] = figures["candidate"]["p50_ms"] / figures["champion"]["p50_ms"]
    return StageReport(stage="performance", gate=gate, headline=describe_figures(figures), details=details)
