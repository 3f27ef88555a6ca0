"""Timing models side by side, and intervals on the figures, so a latency gate judges the model and not the box.

Models are timed interleaved in blocks (one model's block, then the other's, the order reversed every block): a
moment the machine is busy hits both. A percentile of a few hundred calls moves with a handful of stalls, so a
gate reads a bootstrap interval that resamples whole blocks (a block and the same-numbered block of the other model
were timed side by side, so they are drawn together), and refuses only when the whole interval lies beyond its
limit."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK = 20   # batch-1 calls a model makes before the other takes its turn
TURNS = 4    # turns of batch calls per model when measuring throughput


@dataclass(frozen=True)
class Timings:
    latencies_us: dict[str, np.ndarray]   # per model: every timed batch-1 call, µs, in blocks of BLOCK
    rows_per_s: dict[str, float]          # per model: at the batch size


def time_interleaved(models: dict[str, Callable[[Any], Any]], rows: list, batch: Any, rounds: int,
                     seconds: float, rows_in_batch: int | None = None) -> Timings:
    """Batch-1 latency of every model over `rounds` calls each, cycling through `rows` (one-row inputs), the models
    taking turns in blocks of BLOCK calls; then rows/s on `batch` (of `rows_in_batch` rows, len(batch) when not
    given), again in turns, about `seconds` per model in all."""
    names = list(models)
    for name in names:   # warm-up: first calls allocate
        for row in rows[:5]:
            models[name](row)
    timings: dict[str, list[float]] = {name: [] for name in names}
    for block in range(0, rounds, BLOCK):
        for name in names if block // BLOCK % 2 == 0 else names[::-1]:
            predict, timed = models[name], timings[name]
            for i in range(block, min(rounds, block + BLOCK)):
                row = rows[i % len(rows)]
                started = time.perf_counter_ns()
                predict(row)
                timed.append((time.perf_counter_ns() - started) / 1e3)
    size = rows_in_batch or len(batch)
    spent = {name: 0.0 for name in names}
    done = {name: 0 for name in names}
    for _ in range(TURNS):
        for name in names:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds / TURNS:
                models[name](batch)
                done[name] += size
            spent[name] += time.perf_counter() - started
    return Timings({name: np.asarray(values) for name, values in timings.items()},
                   {name: done[name] / spent[name] for name in names})


def block_draws(calls: int, block: int, resamples: int, seed: int = 0) -> np.ndarray:
    """(resamples, calls) indices: whole blocks of `block` consecutive calls drawn with replacement."""
    starts = np.arange(0, calls, block)
    rng = np.random.default_rng(seed)
    chosen = starts[rng.integers(0, len(starts), (resamples, len(starts)))]
    draws = (chosen[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, -1)
    return np.minimum(draws, calls - 1)   # a short last block repeats its last call


def interval(draws: np.ndarray, point: float, confidence: float) -> dict[str, float]:
    """{value, low, high, confidence}: the point figure and the percentile interval of its resampled values."""
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return {"value": float(point), "low": float(low), "high": float(high), "confidence": confidence}


def p99_interval(latencies: np.ndarray, resamples: int, confidence: float, block: int = BLOCK) -> dict[str, float]:
    """The p99 of one model's calls and its block-bootstrap interval."""
    draws = np.percentile(latencies[block_draws(len(latencies), block, resamples)], 99, axis=1)
    return interval(draws, np.percentile(latencies, 99), confidence)


def p99_ratio_interval(candidate: np.ndarray, reference: np.ndarray, resamples: int, confidence: float,
                       block: int = BLOCK) -> dict[str, float]:
    """candidate p99 / reference p99 and its interval, the two drawn by the same blocks (timed side by side)."""
    calls = min(len(candidate), len(reference))
    draws = block_draws(calls, block, resamples)
    ratios = np.percentile(candidate[:calls][draws], 99, axis=1) / np.percentile(reference[:calls][draws], 99, axis=1)
    return interval(ratios, np.percentile(candidate, 99) / np.percentile(reference, 99), confidence)


def p99_excess_interval(measured: np.ndarray, reference: np.ndarray, resamples: int,
                        confidence: float) -> dict[str, float]:
    """p99(measured) - p99(reference) and its interval, for pairs timed one right after the other (pair i of each
    drawn together): what `measured` adds at the tail beyond what the reference shows of the box."""
    draws = block_draws(len(measured), 1, resamples)
    excess = np.percentile(measured[draws], 99, axis=1) - np.percentile(reference[draws], 99, axis=1)
    return interval(excess, np.percentile(measured, 99) - np.percentile(reference, 99), confidence)


def median_excess_interval(measured: np.ndarray, reference: np.ndarray, resamples: int,
                           confidence: float) -> dict[str, float]:
    """The median of measured[i] - reference[i] and its interval, for pairs timed one right after the other: what
    a typical call adds beyond the reference (a stall that hits one side of a pair moves the median little)."""
    excess = measured - reference
    draws = np.median(excess[block_draws(len(excess), 1, resamples)], axis=1)
    return interval(draws, np.median(excess), confidence)


def confirmed(measure: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """A timing refusal must reproduce: `measure()` returns (timings, a StageReport); a failed one is measured once
    more and only a second failure stands (the report keeps the first measurement's reasons). One stall of a shared
    machine moves a tail figure for whichever model it hits; a truly slower model fails both times."""
    timings, report = measure()
    if report.gate.status != "fail":
        return timings, report
    first = report.gate.reasons
    timings, report = measure()
    report.details["first_measurement_failed"] = first
    if report.gate.status != "fail":
        report.headline += " (passed when measured again; the first measurement failed: " + "; ".join(first) + ")"
    return timings, report
