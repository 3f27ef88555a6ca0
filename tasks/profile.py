"""profile: latency and accuracy of every variant on the same holdout; picks the variant to publish and writes
it behind raw per-column inputs (data/profile/model.onnx, gated on raw parity: what register logs).

DVC stage: `python -m tasks.profile`.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from tasks.core import paths
from tasks.core.artifacts import read_json, sha256_file, write_bytes_atomic, write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.machine import load_during
from tasks.core.metrics import evaluate
from tasks.core.params_spec import ExportParams, Params, ProfileParams
from tasks.core.plots import plot_latency
from tasks.core.runtime import Runner, decision_threshold, onnx_metadata, onnx_runner, open_onnx
from tasks.core.schema_spec import load_schema, schema_from_metadata
from tasks.core.timing import time_interleaved
from tasks.modalities import load_holdout, modality_of
from tasks.modalities.interface import Holdout
from tasks.stages.entry import stage_main
from tasks.training.weights import load_trained
from tasks.variants.quantize import BATCH_DEPENDENT
from tasks.variants.runners import compiled_runner, eager_runner

log = logging.getLogger("torchship.profile")


def profile_variants(runners: dict[str, Runner], holdout, n_classes: int, rules: ProfileParams,
                     same_scores: dict[str, str], threshold: float | None = None) -> tuple[dict[str, dict], dict]:
    """Batch-1 latency and throughput at the profile batch size of every variant, timed interleaved (one block of
    calls each in turn, so a busy moment of the machine hits them all), with the machine's load meanwhile; and
    holdout scores, measured by the decision rule the served graph applies (a binary model's `threshold`, else the
    argmax), or for a variant in `same_scores` those of the variant it names."""
    rows = [holdout.inputs[i][None] for i in range(min(len(holdout.inputs), 64))]
    block = holdout.inputs[np.arange(rules.batch_size) % len(holdout.inputs)]   # rows or images, repeated
    with load_during() as load:
        timings = time_interleaved(runners, rows, block, rules.rounds, rules.throughput_seconds)
    scores = {name: evaluate(runner, holdout.inputs, holdout.labels, n_classes, threshold=threshold)
              for name, runner in runners.items() if name not in same_scores}
    results = {}
    for name in runners:
        latencies = timings.latencies_us[name]
        results[name] = {"p50_us": float(np.percentile(latencies, 50)), "p99_us": float(np.percentile(latencies, 99)),
                         "rows_per_s": timings.rows_per_s[name], **scores[same_scores.get(name, name)],
                         "_latencies": latencies}
    return results, load


def select_variant(results: dict[str, dict], servable: dict[str, str]) -> str:
    """The servable (publishable ONNX) variant with the lowest batch-1 p50: what the service will run."""
    return min((name for name in results if name in servable), key=lambda name: results[name]["p50_us"])


def candidate_runners(params: Params) -> tuple[dict[str, Runner], dict[str, str]]:
    """Every variant that passed its gate: name -> runner, and the servable ones: name -> ONNX path (an ONNX file
    whose answer for a row does not depend on the rows batched with it: not BATCH_DEPENDENT)."""
    threads = params.profile.threads
    model, _ = load_trained(paths.MODEL_WEIGHTS)
    parity, compress = read_json(paths.PARITY_REPORT), read_json(paths.COMPRESS_REPORT)
    runners = {"eager-fp32": eager_runner(model), "onnx-fp32": onnx_runner(paths.ONNX_MODEL, threads)}
    servable = {"onnx-fp32": str(paths.ONNX_MODEL)}
    if parity.get("compile", {}).get("publishable"):
        runners["eager-compile"] = compiled_runner(model)
    for name, entry in compress["variants"].items():
        if not entry["publishable"]:
            continue
        if "path" in entry:
            runners[name] = onnx_runner(Path(entry["path"]), threads)
            if name not in BATCH_DEPENDENT:
                servable[name] = entry["path"]
    return runners, servable


def publish_raw_model(name: str, variant: Path, holdout: Holdout, rules: ExportParams,
                      threads: int) -> tuple[dict, GateResult]:
    """Compose the selected variant into the served graph, by its modality (raw inputs in: a table's columns, an
    image's pixels), and gate it on raw parity with the bare variant on the modality's probe; only a passing graph
    is written (to paths.RAW_MODEL). Returns its report entry and gate."""
    import onnx

    bare = onnx.load(str(variant))
    schema = schema_from_metadata({p.key: p.value for p in bare.metadata_props})
    modality = modality_of(schema)
    composed = modality.compose(bare, schema).SerializeToString()
    gate = modality.raw_parity(name, open_onnx(variant, threads), open_onnx(composed, threads), schema, holdout, rules,
                               composed)
    entry = {"variant": name, "variant_path": str(variant), "gate": gate.model_dump()}
    if gate.status == "fail":
        paths.RAW_MODEL.unlink(missing_ok=True)   # never leave an earlier run's graph where register looks
    else:
        write_bytes_atomic(paths.RAW_MODEL, composed)
        entry.update(path=str(paths.RAW_MODEL), bytes=len(composed), sha256=sha256_file(paths.RAW_MODEL))
    log.info("raw model: %s", gate.summary())
    return entry, gate


def run(params: Params) -> None:
    """DVC stage body: time every gated variant on the same rows; choose; compose the choice behind raw inputs
    (raw parity gate); report and plot."""
    from tasks.core.tracking import stage_run

    torch.set_num_threads(params.profile.threads)
    schema = load_schema(paths.SCHEMA)
    holdout = load_holdout(schema)
    runners, servable = candidate_runners(params)
    threshold = decision_threshold(onnx_metadata(paths.ONNX_MODEL))   # every variant is served with the teacher's
    # Compiled scores equal eager's by the parity gate; scoring the holdout would compile two more shapes.
    results, load = profile_variants(runners, holdout, len(schema.classes), params.profile,
                                     {"eager-compile": "eager-fp32"}, threshold)
    selected = select_variant(results, servable)
    plot_latency({name: r.pop("_latencies") for name, r in results.items()}, paths.LATENCY_PLOT)
    eager = results["eager-fp32"]
    batch = params.profile.batch_size
    compile_pays = ({"batch_1": results["eager-compile"]["p50_us"] < eager["p50_us"],
                     f"batch_{batch}": results["eager-compile"]["rows_per_s"] > eager["rows_per_s"]}
                    if "eager-compile" in results else None)
    chosen = results[selected]
    raw_model, raw_gate = publish_raw_model(selected, Path(servable[selected]), holdout, params.export,
                                            params.profile.threads)
    report = {"variants": results, "selected": selected, "selected_path": str(paths.RAW_MODEL),
              "raw_model": raw_model, "not_served": {name: f"{how}: a row's answer depends on its batch"
                                                     for name, how in BATCH_DEPENDENT.items() if name in results},
              "threads": params.profile.threads, "batch_size": batch, "compile_pays": compile_pays, "load": load,
              "selected_vs_eager": {"p50_ratio": chosen["p50_us"] / eager["p50_us"],
                                    "throughput_ratio": chosen["rows_per_s"] / eager["rows_per_s"]},
              "headline": f"{selected}: p50 {chosen['p50_us']:.0f} µs ({eager['p50_us'] / chosen['p50_us']:.1f}x "
                          f"eager), {chosen['rows_per_s'] / eager['rows_per_s']:.1f}x throughput at {batch}, "
                          f"acc {chosen['accuracy']:.4f}"}
    write_json_atomic(paths.PROFILE_REPORT, report)
    raw_gate.model_copy(update={"evidence": str(paths.PROFILE_REPORT)}).enforce()
    print_profile_table(report)
    with stage_run(params.tracking, "profile") as stage_log:
        stage_log.log_params({**params.profile.model_dump(), "selected": selected})
        for name, figures in results.items():
            stage_log.log_metrics({f"{name}.{k}": v for k, v in figures.items()})
        stage_log.set_tags({"gate.raw_parity": raw_gate.status})
        stage_log.log_artifact(str(paths.LATENCY_PLOT))
        stage_log.log_artifact(str(paths.PROFILE_REPORT))
    log.info("profile: %s", report["headline"])


def print_profile_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"profile: {report['threads']} thread(s); selected {report['selected']}")
    for column in ("variant", "p50 µs", "p99 µs", f"rows/s @{report['batch_size']}", "accuracy", "f1 macro"):
        table.add_column(column, justify="right" if column != "variant" else "left", no_wrap=True)
    for name, r in report["variants"].items():
        label = f"[dim]{name} (not served)" if name in report["not_served"] else name
        table.add_row(f"[bold green]{name}" if name == report["selected"] else label, f"{r['p50_us']:.0f}",
                      f"{r['p99_us']:.0f}", f"{r['rows_per_s']:,.0f}", f"{r['accuracy']:.4f}", f"{r['f1_macro']:.4f}")
    Console(stderr=True, width=120).print(table)
    for name, why in report["not_served"].items():
        Console(stderr=True, width=120).print(f"  {name}: not served ({why}; the service batches requests)")


if __name__ == "__main__":
    stage_main("profile", run)
