"""export: the trained model as ONNX (schema in its metadata) and a torch.export program, each parity-gated.

DVC stage: `python -m tasks.export`.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn

from models import FeatureLayout, build_model
from tasks import layout
from tasks.artifacts import sha256_file, write_atomic, write_json_atomic
from tasks.config import ExportParams, Params
from tasks.contract import Schema, encode_features, load_schema
from tasks.gate import GateResult

log = logging.getLogger("torchship.export")
MAX_BATCH = 1 << 16


def load_trained(path: Path = layout.MODEL_WEIGHTS) -> tuple[nn.Module, dict]:
    """Rebuild the eager model from its weights-only checkpoint (never unpickles code)."""
    checkpoint = torch.load(path, weights_only=True)
    spec = checkpoint["model"]
    model = build_model(spec["name"], FeatureLayout(**checkpoint["layout"]), **spec["kwargs"])
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), checkpoint


def probe_rows(holdout: pd.DataFrame, schema: Schema, count: int, seed: int = 0) -> np.ndarray:
    """Holdout rows plus edge rows: all-missing, extreme numbers, unseen and negative category codes."""
    sample = holdout.sample(n=min(count, len(holdout)), random_state=seed)
    rows = encode_features(sample, schema)
    edges = [np.full(len(schema.features), np.nan, dtype=np.float32)]
    for j, feature in enumerate(schema.features):
        for value in ((1e4, -1e4) if feature.kind == "numeric" else (len(feature.categories) + 7, -3)):
            edge = rows[0].copy()
            edge[j] = value
            edges.append(edge)
    return np.vstack([rows, np.stack(edges)]).astype(np.float32)


def check_parity(name: str, eager: np.ndarray, variant: np.ndarray, rules: ExportParams) -> GateResult:
    """Logits within atol (scaled by the logit's size) and argmax agreement on the probe set."""
    scale = np.maximum(1.0, np.abs(eager))
    diff = np.abs(eager - variant) / scale
    worst = diff.max(axis=1)
    agreement = float((eager.argmax(1) == variant.argmax(1)).mean())
    failures = []
    diverging = np.flatnonzero(worst > rules.parity_atol)
    if len(diverging):
        failures.append(f"{len(diverging)} probe rows exceed atol {rules.parity_atol:g} "
                        f"(rows {diverging[:10].tolist()}, worst {worst.max():.3g})")
    if agreement < rules.min_argmax_agreement:
        failures.append(f"argmax agreement {agreement:.4f} < {rules.min_argmax_agreement}")
    return GateResult.decide(f"parity {name}", failures, passed=f"max scaled diff {worst.max():.2e}, "
                                                                f"argmax agreement {agreement:.4f}")


def export_onnx(model: nn.Module, schema: Schema, exporter: str, path: Path) -> None:
    """ONNX with a dynamic batch axis; the schema rides in metadata so the file is self-describing."""
    import onnx

    example = torch.zeros(4, len(schema.features))

    def write(tmp: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" noise
                program = torch.onnx.export(model, (example,), dynamo=True, input_names=["x"], output_names=["logits"],
                                            dynamic_shapes={"x": {0: torch.export.Dim("batch", max=MAX_BATCH)}},
                                            verbose=False)
                program.save(str(tmp))
            else:
                torch.onnx.export(model, (example,), str(tmp), dynamo=False, input_names=["x"],
                                  output_names=["logits"], opset_version=17,
                                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
        proto = onnx.load(str(tmp))
        onnx.checker.check_model(proto)
        for key, value in (("torchship.schema", schema.model_dump_json()), ("torchship.exporter", exporter)):
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(proto, str(tmp))

    write_atomic(path, write)


def export_program(model: nn.Module, n_features: int, path: Path) -> None:
    """A torch.export program (.pt2) with a dynamic batch dimension."""
    example = torch.zeros(4, n_features)
    program = torch.export.export(model, (example,),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}})
    write_atomic(path, lambda tmp: torch.export.save(program, str(tmp)))


def onnx_runner(path: Path, threads: int = 1) -> Callable[[np.ndarray], np.ndarray]:
    """A function rows -> logits backed by ONNX Runtime on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda rows: session.run(None, {"x": rows})[0]


def compiled_runner(model: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    """torch.compile (inductor, static shapes: a dynamic graph was much slower here) as rows -> logits.
    A runtime option, not a file: each new batch size compiles once, then is cached."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # parallel compile workers starve 2-core boxes
    compiled = torch.compile(model, dynamic=False)

    def run(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return compiled(torch.from_numpy(rows)).numpy()

    return run


def publish_variant(name: str, eager: np.ndarray, probe: np.ndarray, rules: ExportParams,
                    make: Callable[[], None] | None, runner: Callable[[], Callable[[np.ndarray], np.ndarray]],
                    path: Path | None = None) -> tuple[dict, GateResult]:
    """Build one variant (a file, or a runtime option when `path` is None), run it on the probe set,
    and gate it on parity with eager. Returns its report entry and the gate."""
    started = time.perf_counter()
    try:
        if make:
            make()
        gate = check_parity(name, eager, runner()(probe), rules)
    except Exception as exc:  # an exporter or compiler that breaks on this model: the variant is not published
        if name == "onnx":
            raise
        gate = GateResult.decide(f"parity {name}", [f"could not be built or run: {type(exc).__name__}: {exc}"])
    entry = {"seconds": round(time.perf_counter() - started, 2), "publishable": gate.status != "fail",
             "gate": gate.model_dump()}
    if path is not None and path.exists():
        entry.update(path=str(path), bytes=path.stat().st_size, sha256=sha256_file(path))
    log.info("%s: %s", name, gate.summary())
    return entry, gate


def run(params: Params) -> None:
    """DVC stage body: export ONNX and .pt2, try torch.compile, gate each on parity, write the report.
    The served format (ONNX) failing parity stops the stage; .pt2 or compile failing is reported and
    that variant is marked unpublishable."""
    import mlflow

    from tasks.tracking import stage_run

    model, _ = load_trained()
    schema = load_schema(layout.SCHEMA)
    probe = probe_rows(pd.read_parquet(layout.HOLDOUT_SPLIT), schema, params.export.probe_rows)
    with torch.no_grad():
        eager = model(torch.from_numpy(probe)).numpy()
    rules = params.export
    variants = {
        "onnx": (lambda: export_onnx(model, schema, rules.onnx_exporter, layout.ONNX_MODEL),
                 lambda: onnx_runner(layout.ONNX_MODEL), layout.ONNX_MODEL),
        "pt2": (lambda: export_program(model, len(schema.features), layout.PT2_MODEL),
                lambda: _pt2_runner(layout.PT2_MODEL), layout.PT2_MODEL),
    }
    if rules.compile:
        variants["compile"] = (None, lambda: compiled_runner(model), None)
    report, gates = {}, {}
    for name, (make, runner, path) in variants.items():
        report[name], gates[name] = publish_variant(name, eager, probe, rules, make, runner, path)
    report["exporter"] = rules.onnx_exporter
    report["probe_rows"] = len(probe)
    report["headline"] = "parity " + ", ".join(f"{name} {gate.status}" for name, gate in gates.items())
    write_json_atomic(layout.PARITY_REPORT, report)
    with stage_run(params.tracking, "export"):
        mlflow.log_params(rules.model_dump())
        mlflow.log_metrics({f"{k}_bytes": v["bytes"] for k, v in report.items() if isinstance(v, dict) and "bytes" in v})
        mlflow.set_tags({f"gate.parity.{name}": gate.status for name, gate in gates.items()})
        mlflow.log_artifact(str(layout.PARITY_REPORT))
    for name, gate in gates.items():
        if gate.status == "fail" and name != "onnx":
            log.error("%s is not published: %s", name, gate.summary())
    gates["onnx"].enforce()


def _pt2_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    module = torch.export.load(str(path)).module()
    return lambda rows: module(torch.from_numpy(rows)).detach().numpy()


if __name__ == "__main__":
    from tasks.stage import stage_main

    stage_main("export", run)
