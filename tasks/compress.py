"""compress: dynamic int8 quantisation of the ONNX model, gated on the accuracy budget.

DVC stage: `python -m tasks.compress`.
"""
from __future__ import annotations

import logging
from pathlib import Path

from tasks import layout
from tasks.artifacts import sha256_file, write_atomic, write_json_atomic
from tasks.config import CompressParams, Params
from tasks.contract import load_schema
from tasks.export import onnx_runner
from tasks.gate import GateResult
from tasks.holdout import load_holdout
from tasks.metrics import evaluate

log = logging.getLogger("torchship.compress")


def quantize_onnx(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic int8 (weights int8, activations quantised per call); metadata kept."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(tmp: Path) -> None:
        root = logging.getLogger()
        level, root.level = root.level, logging.ERROR  # its "consider pre-processing" hint is noise here
        try:
            quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8)
        finally:
            root.setLevel(level)
        proto, original = onnx.load(str(tmp)), onnx.load(str(source))
        del proto.metadata_props[:]
        proto.metadata_props.extend(original.metadata_props)
        onnx.save(proto, str(tmp))

    write_atomic(target, write)


def accuracy_budget(name: str, baseline: dict, variant: dict, rules: CompressParams) -> GateResult:
    """A compressed variant may lose at most `max_drop` accuracy against fp32 on the same holdout."""
    drop = baseline["accuracy"] - variant["accuracy"]
    failures = [f"accuracy drop {drop * 100:.2f} points > budget {rules.max_drop * 100:.2f}"] if drop > rules.max_drop else []
    return GateResult.decide(f"accuracy budget {name}", failures,
                             passed=f"accuracy drop {drop * 100:+.2f} points within {rules.max_drop * 100:.2f}")


def run(params: Params) -> None:
    """DVC stage body: quantise, score both on holdout, gate, report (a failed variant is not published)."""
    import mlflow

    from tasks.tracking import stage_run

    schema = load_schema(layout.SCHEMA)
    holdout = load_holdout(schema)
    quantize_onnx(layout.ONNX_MODEL, layout.INT8_MODEL)
    n_classes = len(schema.classes)
    fp32 = evaluate(onnx_runner(layout.ONNX_MODEL, threads=2), holdout.features, holdout.labels, n_classes)
    int8 = evaluate(onnx_runner(layout.INT8_MODEL, threads=2), holdout.features, holdout.labels, n_classes)
    gate = accuracy_budget("onnx-int8", fp32, int8, params.compress)
    ratio = layout.ONNX_MODEL.stat().st_size / layout.INT8_MODEL.stat().st_size
    report = {"fp32": fp32, "variants": {"onnx-int8": {
        "path": str(layout.INT8_MODEL), "bytes": layout.INT8_MODEL.stat().st_size,
        "sha256": sha256_file(layout.INT8_MODEL), "metrics": int8, "size_ratio": ratio,
        "publishable": gate.status != "fail", "gate": gate.model_dump()}},
        "headline": f"int8 {ratio:.1f}x smaller, {gate.summary()}"}
    write_json_atomic(layout.COMPRESS_REPORT, report)
    with stage_run(params.tracking, "compress"):
        mlflow.log_params(params.compress.model_dump())
        mlflow.log_metrics({"int8_accuracy": int8["accuracy"], "fp32_accuracy": fp32["accuracy"], "int8_size_ratio": ratio})
        mlflow.set_tag("gate.onnx-int8", gate.status)
    log.info("onnx-int8: %s (%.1fx smaller)", gate.summary(), ratio)


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("compress", run)
