"""compress: int8 quantisation and a distilled student, each gated on the accuracy budget.

DVC stage: `python -m tasks.compress`. Variants, all scored on the same holdout as the fp32 teacher:
- `onnx-int8`: ONNX Runtime dynamic int8 of the teacher's ONNX file (tables);
- `onnx-int8-static` (compress.static_int8; images always): ONNX Runtime static int8 (QDQ, weights per output channel,
  convolutions included) calibrated on training rows or images;
- `student-onnx-fp32` / `student-onnx-int8`: the distilled student (tasks/training/distill.py) exported with the
  same parity gate as the teacher, then quantised (images: static int8).
No eager int8: `torch.ao.quantization` is being removed from PyTorch, its dynamic int8 was only ever profiled, never
served (ONNX Runtime's int8 files are what ships), and its successor (torchao) showed no CPU benefit here.
A variant over budget is reported and marked unpublishable; profile only picks publishable ones.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.core import paths
from tasks.core.artifacts import sha256_file, write_json_atomic
from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.metrics import bootstrap_drop, classification_metrics, predict
from tasks.core.params_spec import CompressParams, Params
from tasks.core.runtime import Runner, onnx_runner
from tasks.core.schema_spec import Schema, load_schema
from tasks.modalities import load_holdout, modality_of
from tasks.modalities.interface import Holdout
from tasks.stages.entry import stage_main
from tasks.training.weights import load_trained
from tasks.variants.exporters import export_onnx
from tasks.variants.parity import publish_variant
from tasks.variants.quantize import QuantizationFailed, quantize_onnx, quantize_onnx_static
from tasks.variants.runners import eager_runner

log = logging.getLogger("torchship.compress")


def accuracy_budget(name: str, drop: dict, rules: CompressParams) -> GateResult:
    """A compressed variant may lose at most `max_drop` of the metric against the fp32 teacher on the same
    holdout (point estimate); the bootstrap interval is reported beside it."""
    figure = (f"{rules.metric} drop {drop['drop'] * 100:+.2f} points "
              f"({rules.confidence:.0%} CI {drop['low'] * 100:+.2f} to {drop['high'] * 100:+.2f})")
    failures = [f"{figure} > budget {rules.max_drop * 100:.2f}"] if drop["drop"] > rules.max_drop else []
    return GateResult.decide(f"accuracy budget {name}", failures, passed=f"{figure} within {rules.max_drop * 100:.2f}")


Variants = dict[str, tuple[Path | None, Runner]]   # name -> (file or None, rows -> logits)


def quantized(name: str, quantize: Callable[[], None], path: Path, threads: int, variants: Variants,
              failed: dict[str, str]) -> None:
    """Add the variant `quantize()` writes to `path`; when ONNX Runtime's quantizer fails, record its error in
    `failed` instead: the variant is reported unpublishable, the other variants still stand."""
    try:
        quantize()
    except QuantizationFailed as exc:
        log.error("%s is not built: %s", name, exc)
        failed[name] = str(exc)
        path.unlink(missing_ok=True)   # never leave an earlier run's file where this run's report names none
        return
    variants[name] = (path, onnx_runner(path, threads))


def calibration_inputs(schema: Schema, count: int) -> np.ndarray:
    """Up to `count` training items (the bare model's inputs), in a seeded order: what static int8 calibrates on."""
    inputs = modality_of(schema).read_split(paths.TRAIN_SPLIT, schema).inputs
    return inputs[np.random.default_rng(0).permutation(len(inputs))[:count]]


def build_variants(params: Params, schema: Schema) -> tuple[Variants, dict[str, str]]:
    """Make every compressed variant; returns them, and name -> the quantizer's error for those it could not make.
    The int8 kinds are the modality's (images: static only, since ONNX Runtime's dynamic int8 of convolutions is
    slower than fp32 on CPUs), static int8 also where compress.static_int8 asks for it."""
    rules = params.compress
    paths.VARIANTS.mkdir(parents=True, exist_ok=True)
    threads = params.runtime.threads
    variants: Variants = {}
    failed: dict[str, str] = {}
    kinds = modality_of(schema).int8
    if "dynamic" in kinds:
        quantized("onnx-int8", lambda: quantize_onnx(paths.ONNX_MODEL, paths.INT8_MODEL), paths.INT8_MODEL, threads,
                  variants, failed)
    if rules.static_int8 or "static" in kinds:
        calibration = calibration_inputs(schema, rules.calibration_rows)
        quantized("onnx-int8-static", lambda: quantize_onnx_static(paths.ONNX_MODEL, paths.STATIC_INT8_MODEL,
                                                                   calibration),
                  paths.STATIC_INT8_MODEL, threads, variants, failed)
    return variants, failed


def build_student(params: Params, schema: Schema, holdout: Holdout, threshold: float | None = None
                  ) -> tuple[dict, GateResult, Variants, dict[str, str]]:
    """Train the student (torchrun), export it to ONNX through the same parity gate, quantise it. The student
    learns the teacher's (calibrated) probabilities, so it is served with the teacher's decision `threshold`."""
    from tasks.training.distill import train_student

    threads = params.runtime.threads
    try:
        train_student(params)
    except TorchshipError as exc:  # the student is optional: the teacher's variants still stand
        gate = GateResult.decide("parity student-onnx", [f"student training failed: {exc}"])
        return {"publishable": False, "gate": gate.model_dump()}, gate, {}, {}
    student, _ = load_trained(paths.STUDENT_WEIGHTS)
    probe, labels = modality_of(schema).probe(holdout, schema, params.export.probe_rows)
    entry, gate = publish_variant("student-onnx", eager_runner(student)(probe), probe, params.export,
                                  lambda: export_onnx(student, schema, params.export.onnx_exporter, paths.STUDENT_ONNX,
                                                      threshold),
                                  lambda: onnx_runner(paths.STUDENT_ONNX, threads), paths.STUDENT_ONNX, labels=labels)
    if gate.status == "fail":
        return entry, gate, {}, {}
    variants: Variants = {"student-onnx-fp32": (paths.STUDENT_ONNX, onnx_runner(paths.STUDENT_ONNX, threads))}
    failed: dict[str, str] = {}
    if "dynamic" not in modality_of(schema).int8:   # the student's int8 is the teacher's kind
        calibration = calibration_inputs(schema, params.compress.calibration_rows)
        quantize = lambda: quantize_onnx_static(paths.STUDENT_ONNX, paths.STUDENT_INT8, calibration)  # noqa: E731
    else:
        quantize = lambda: quantize_onnx(paths.STUDENT_ONNX, paths.STUDENT_INT8)  # noqa: E731
    quantized("student-onnx-int8", quantize, paths.STUDENT_INT8, threads, variants, failed)
    return entry, gate, variants, failed


def print_variant_table(report: dict) -> None:
    """Sizes, metric, drop with its interval and the gate of every variant, on the console."""
    from rich.console import Console
    from rich.table import Table

    metric = report["metric"]
    table = Table(title=f"compress: accuracy budget vs fp32 teacher ({metric} {report['fp32'][metric]:.4f})")
    for column in ("variant", "size", metric, "drop (points)", f"{report['confidence']:.0%} CI", "gate"):
        table.add_column(column, no_wrap=True)
    for name, entry in report["variants"].items():
        if "drop" not in entry:   # not built: the quantizer's error is in the log and the report
            table.add_row(name, "-", "-", "-", "-", "[red]not built")
            continue
        drop = entry["drop"]
        table.add_row(name, f"{entry['bytes'] / 1024:,.0f} KiB" if "bytes" in entry else "in memory",
                      f"{entry['metrics'][metric]:.4f}", f"{drop['drop'] * 100:+.2f}",
                      f"{drop['low'] * 100:+.2f} .. {drop['high'] * 100:+.2f}",
                      {"pass": "[green]pass", "warn": "[yellow]warn", "fail": "[red]fail"}[entry["gate"]["status"]])
    Console(stderr=True, width=120).print(table)


def run(params: Params) -> None:
    """DVC stage body: build, score against the fp32 teacher on holdout, gate, report."""
    from tasks.core.tracking import stage_run

    rules = params.compress
    schema = load_schema(paths.SCHEMA)
    holdout = load_holdout(schema)
    n_classes = len(schema.classes)
    _, trained = load_trained(paths.MODEL_WEIGHTS)
    threshold = trained.get("threshold")   # every variant is judged by the decision rule it will be served with
    reference = predict(onnx_runner(paths.ONNX_MODEL, params.runtime.threads), holdout.inputs, threshold=threshold)
    fp32 = {**classification_metrics(holdout.labels, reference, n_classes), "bytes": paths.ONNX_MODEL.stat().st_size}
    variants, failed = build_variants(params, schema)
    student_parity = None
    paths.STUDENT.mkdir(parents=True, exist_ok=True)
    paths.STUDENT_CHECKPOINTS.mkdir(parents=True, exist_ok=True)  # a DVC output even when distillation is off
    if params.distill.enabled:
        student_parity, parity_gate, student, student_failed = build_student(params, schema, holdout, threshold)
        variants.update(student)
        failed.update(student_failed)
        if parity_gate.status == "fail":
            log.error("student-onnx is not published: %s", parity_gate.summary())
    else:
        write_json_atomic(paths.STUDENT / "metrics.json", {"enabled": False, "headline": "distillation off"})
    report: dict = {"reference": "onnx-fp32 teacher", "metric": rules.metric, "confidence": rules.confidence,
                    "fp32": fp32, "max_drop": rules.max_drop, "variants": {},
                    "student_parity": student_parity}
    for name, (path, runner) in variants.items():
        predicted = predict(runner, holdout.inputs, threshold=threshold)
        drop = bootstrap_drop(holdout.labels, reference, predicted, n_classes, rules.metric, rules.bootstrap,
                              rules.confidence)
        gate = accuracy_budget(name, drop, rules)
        entry = {"metrics": classification_metrics(holdout.labels, predicted, n_classes), "drop": drop,
                 "publishable": gate.status != "fail", "gate": gate.model_dump()}
        if path is not None:
            entry.update(path=str(path), bytes=path.stat().st_size, sha256=sha256_file(path),
                         size_ratio=fp32["bytes"] / path.stat().st_size)
        report["variants"][name] = entry
        log.info("%s: %s", name, gate.summary())
    for name, error in failed.items():
        gate = GateResult.decide(f"quantize {name}", [error])
        report["variants"][name] = {"publishable": False, "gate": gate.model_dump(), "error": error}
    passed = [name for name, v in report["variants"].items() if v["publishable"]]
    tried = len(report["variants"])
    report["headline"] = f"{len(passed)}/{tried} variants within {rules.max_drop * 100:.2f} points: " + \
                         (", ".join(passed) or "none")
    write_json_atomic(paths.COMPRESS_REPORT, report)
    print_variant_table(report)
    with stage_run(params.tracking, "compress") as stage_log:
        stage_log.log_params({**rules.model_dump(),
                              **{f"distill.{k}": v for k, v in params.distill.model_dump().items()}})
        for name, entry in report["variants"].items():
            stage_log.set_tags({f"gate.{name}": entry["gate"]["status"]})
            if "drop" not in entry:
                continue
            stage_log.log_metrics({f"{name}.{rules.metric}_drop": entry["drop"]["drop"],
                                   f"{name}.{rules.metric}": entry["metrics"][rules.metric],
                                   **({f"{name}.bytes": entry["bytes"]} if "bytes" in entry else {})})
        stage_log.log_artifact(str(paths.COMPRESS_REPORT))


if __name__ == "__main__":
    stage_main("compress", run)
