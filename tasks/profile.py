"""profile: latency and accuracy of every variant on the same holdout; picks the variant to publish.

DVC stage: `python -m tasks.profile`.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
import torch

from tasks import layout
from tasks.artifacts import read_json, write_json_atomic
from tasks.config import Params, ProfileParams
from tasks.contract import load_schema
from tasks.export import load_trained, onnx_runner
from tasks.holdout import load_holdout
from tasks.metrics import evaluate
from tasks.plots import plot_latency

log = logging.getLogger("torchship.profile")
Runner = Callable[[np.ndarray], np.ndarray]


def time_calls(runner: Runner, rows: np.ndarray, rounds: int) -> np.ndarray:
    """Per-call latency in µs, cycling through the given rows (a few warm-up calls first)."""
    for i in range(min(10, rounds)):
        runner(rows[i % len(rows)][None])
    timings = np.empty(rounds)
    for i in range(rounds):
        row = rows[i % len(rows)][None]
        started = time.perf_counter_ns()
        runner(row)
        timings[i] = (time.perf_counter_ns() - started) / 1e3
    return timings


def throughput(runner: Runner, rows: np.ndarray, batch: int, seconds: float = 0.5) -> float:
    """Rows per second at a fixed batch size, measured for about `seconds`."""
    block = np.resize(rows, (batch, rows.shape[1])).astype(np.float32)
    runner(block)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        runner(block)
        calls += 1
    return calls * batch / (time.perf_counter() - started)


def profile_variant(runner: Runner, holdout, n_classes: int, rules: ProfileParams) -> dict:
    latencies = time_calls(runner, holdout.features, rules.rounds)
    return {"p50_us": float(np.percentile(latencies, 50)), "p99_us": float(np.percentile(latencies, 99)),
            "rows_per_s": throughput(runner, holdout.features, rules.batch_size),
            **evaluate(runner, holdout.features, holdout.labels, n_classes), "_latencies": latencies}


def select_variant(results: dict[str, dict], publishable: set[str]) -> str:
    """The publishable ONNX variant with the lowest batch-1 p50 (what the service will run)."""
    candidates = [name for name in results if name in publishable]
    return min(candidates, key=lambda name: results[name]["p50_us"])


def run(params: Params) -> None:
    """DVC stage body: time eager, ONNX fp32 and ONNX int8; choose; report and plot."""
    import mlflow

    from tasks.tracking import stage_run

    torch.set_num_threads(params.profile.threads)
    schema = load_schema(layout.SCHEMA)
    holdout = load_holdout(schema)
    model, _ = load_trained()
    compress = read_json(layout.COMPRESS_REPORT)

    def eager(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(rows)).numpy()

    runners = {"eager-fp32": eager, "onnx-fp32": onnx_runner(layout.ONNX_MODEL, params.profile.threads)}
    publishable = {"onnx-fp32"}
    if compress["variants"]["onnx-int8"]["publishable"]:
        runners["onnx-int8"] = onnx_runner(layout.INT8_MODEL, params.profile.threads)
        publishable.add("onnx-int8")
    results = {name: profile_variant(runner, holdout, len(schema.classes), params.profile)
               for name, runner in runners.items()}
    selected = select_variant(results, publishable)
    plot_latency({name: r.pop("_latencies") for name, r in results.items()}, layout.LATENCY_PLOT)
    paths = {"onnx-fp32": str(layout.ONNX_MODEL), "onnx-int8": str(layout.INT8_MODEL)}
    speedup = results["eager-fp32"]["p50_us"] / results[selected]["p50_us"]
    report = {"variants": results, "selected": selected, "selected_path": paths[selected],
              "threads": params.profile.threads, "batch_size": params.profile.batch_size,
              "headline": f"{selected}: p50 {results[selected]['p50_us']:.0f} µs ({speedup:.1f}x eager), "
                          f"acc {results[selected]['accuracy']:.4f}"}
    write_json_atomic(layout.PROFILE_REPORT, report)
    with stage_run(params.tracking, "profile"):
        mlflow.log_params({**params.profile.model_dump(), "selected": selected})
        for name, figures in results.items():
            mlflow.log_metrics({f"{name}.{k}": v for k, v in figures.items()})
        mlflow.log_artifact(str(layout.LATENCY_PLOT))
        mlflow.log_artifact(str(layout.PROFILE_REPORT))
    log.info("profile: %s", report["headline"])


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("profile", run)
