"""bless, stage 2, performance: batch-1 latency, batch throughput and file size of the candidate and the champion,
measured in the same process and interleaved (candidate and champion take turns in small blocks, so the noise
of a shared machine hits both), with the machine described. Never compared with figures from another run."""
from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.core.gate import GateResult
from tasks.core.verdicts import StageReport

Predict = Callable[[pd.DataFrame], Any]   # raw rows -> probabilities
BLOCK = 20                                # batch-1 calls a model makes before the other takes its turn
TURNS = 4                                 # turns of batch calls per model when measuring throughput


@dataclass(frozen=True)
class Timings:
    latencies_us: dict[str, np.ndarray]   # per model: every timed batch-1 call, µs
    rows_per_s: dict[str, float]          # per model: at the batch size


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() says only `x86_64` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    """The first CUDA GPU: through torch when this process has loaded it, else from the NVIDIA driver's /proc
    entries (importing torch only to ask would cost bless about 2 s)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return None


def describe_machine(threads: int) -> dict:
    """What the figures were measured on: CPU, cores, threads used, library versions, GPU when there is one."""
    from importlib.metadata import version

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "torch": version("torch"), "onnxruntime": version("onnxruntime"), "numpy": version("numpy"),
            "gpu": gpu_name()}


def time_interleaved(models: dict[str, Predict], rows: list[pd.DataFrame], batch: pd.DataFrame, rounds: int,
                     seconds: float) -> Timings:
    """Batch-1 latency of every model over `rounds` calls each, cycling through `rows` (one-row frames), the
    models taking turns in blocks of BLOCK calls (the order reversed every block); then rows/s on `batch`,
    again in turns, about `seconds` per model in all."""
    names = list(models)
    for name in names:   # warm-up: first calls allocate
        for row in rows[:5]:
            models[name](row)
    timings = {name: [] for name in names}
    for block in range(0, rounds, BLOCK):
        for name in names if block // BLOCK % 2 == 0 else names[::-1]:
            predict, timed = models[name], timings[name]
            for i in range(block, min(rounds, block + BLOCK)):
                row = rows[i % len(rows)]
                started = time.perf_counter_ns()
                predict(row)
                timed.append((time.perf_counter_ns() - started) / 1e3)
    spent = {name: 0.0 for name in names}
    done = {name: 0 for name in names}
    for _ in range(TURNS):
        for name in names:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds / TURNS:
                models[name](batch)
                done[name] += len(batch)
            spent[name] += time.perf_counter() - started
    return Timings({name: np.asarray(values) for name, values in timings.items()},
                   {name: done[name] / spent[name] for name in names})


def summarize_timings(timings: Timings, sizes: dict[str, int]) -> dict[str, dict[str, float]]:
    """{model: p50_ms, p99_ms, mean_ms, rows_per_s, bytes}."""
    return {name: {"p50_ms": float(np.percentile(values, 50)) / 1e3, "p99_ms": float(np.percentile(values, 99)) / 1e3,
                   "mean_ms": float(values.mean()) / 1e3, "rows_per_s": timings.rows_per_s[name],
                   "bytes": sizes[name]}
            for name, values in timings.latencies_us.items()}


def judge_performance(figures: dict[str, dict[str, float]], p99_ms: float, max_ratio: float) -> GateResult:
    """Pure core: fail when the candidate's batch-1 p99 alone exceeds the service's p99 objective, or exceeds
    the champion's (same run) by more than `max_ratio`."""
    candidate, champion = figures["candidate"], figures.get("champion")
    failures = []
    if candidate["p99_ms"] > p99_ms:
        failures.append(f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms exceeds slo.p99_ms {p99_ms:g} before "
                        "any HTTP is added")
    if champion and candidate["p99_ms"] > max_ratio * champion["p99_ms"]:
        failures.append(f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms is "
                        f"{candidate['p99_ms'] / champion['p99_ms']:.1f}x the champion's {champion['p99_ms']:.2f} ms "
                        f"(same run; bless.max_latency_ratio {max_ratio:g})")
    passed = f"candidate batch-1 p99 {candidate['p99_ms']:.2f} ms within slo.p99_ms {p99_ms:g}" + (
        f", {candidate['p99_ms'] / champion['p99_ms']:.2f}x the champion's (bless.max_latency_ratio {max_ratio:g})"
        if champion else "")
    return GateResult.decide("performance", failures, passed=passed)


def confirmed(measure: Callable[[], tuple[Timings, StageReport]]) -> tuple[Timings, StageReport]:
    """A failed measurement is measured once more and only a second failure stands: one stall of a shared
    machine (a page fault, another process's burst) moves the p99 of a few hundred calls several times over for
    whichever model it hits, while a truly slower candidate fails both times. The report keeps the first reasons."""
    timings, report = measure()
    if report.gate.status != "fail":
        return timings, report
    first = report.gate.reasons
    timings, report = measure()
    report.details["first_measurement_failed"] = first
    if report.gate.status != "fail":
        report.headline += " (passed when measured again; the first measurement failed: " + "; ".join(first) + ")"
    return timings, report


def describe_figures(figures: dict[str, dict[str, float]]) -> str:
    """One line: batch-1 p50/p99, rows/s and size per model."""
    return "; ".join(f"{name} p50 {f['p50_ms']:.3f} ms, p99 {f['p99_ms']:.3f} ms, {f['rows_per_s']:,.0f} rows/s, "
                     f"{f['bytes'] / 1024:,.0f} KiB" for name, f in figures.items())


def assess_performance(timings: Timings, sizes: dict[str, int], machine: dict, batch_size: int, p99_ms: float,
                       max_ratio: float) -> StageReport:
    """Pure core of the performance stage: the figures, the gate, the report."""
    figures = summarize_timings(timings, sizes)
    gate = judge_performance(figures, p99_ms, max_ratio)
    details = {"models": figures, "batch_size": batch_size,
               "calls": {k: len(v) for k, v in timings.latencies_us.items()}, "machine": machine}
    if "champion" in figures:
        details["p99_ratio"] = figures["candidate"]["p99_ms"] / figures["champion"]["p99_ms"]
        details["p50_ratio"] = figures["candidate"]["p50_ms"] / figures["champion"]["p50_ms"]
    return StageReport(stage="performance", gate=gate, headline=describe_figures(figures), details=details)
