"""export: the trained model as ONNX (schema in its metadata) and a torch.export program, each parity-gated.

DVC stage: `python -m tasks.export`. The served format (ONNX) failing parity stops the stage; `.pt2` or
torch.compile failing is reported and that variant is marked unpublishable.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.params_spec import Params
from tasks.core.runtime import onnx_runner
from tasks.core.schema_spec import load_schema
from tasks.modalities import load_holdout, modality_of
from tasks.stages.entry import stage_main
from tasks.training.weights import load_trained
from tasks.variants.exporters import export_onnx, export_program
from tasks.variants.parity import publish_variant
from tasks.variants.runners import compiled_runner, pt2_runner

log = logging.getLogger("torchship.export")


def export_probe(schema, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(probe inputs, the labels of its holdout part): holdout items plus the modality's edge cases (rows at the
    extremes, black and white images); the parity gates judge every variant on them."""
    return modality_of(schema).probe(load_holdout(schema), schema, count)


def run(params: Params) -> None:
    """Export ONNX and .pt2, try torch.compile, gate each on parity with eager, write and log the report."""
    from tasks.core.tracking import stage_run

    model, trained = load_trained(paths.MODEL_WEIGHTS)
    schema = load_schema(paths.SCHEMA)
    rules = params.export
    probe, labels = export_probe(schema, rules.probe_rows)
    with torch.no_grad():
        eager = model(torch.from_numpy(probe)).float().numpy()
    threads = params.runtime.threads
    variants = {  # name -> (build the file, open a runner, the file)
        "onnx": (lambda: export_onnx(model, schema, rules.onnx_exporter, paths.ONNX_MODEL, trained.get("threshold")),
                 lambda: onnx_runner(paths.ONNX_MODEL, threads), paths.ONNX_MODEL),
        "pt2": (lambda: export_program(model, schema, paths.PT2_MODEL),
                lambda: pt2_runner(paths.PT2_MODEL), paths.PT2_MODEL),
    }
    if rules.compile:
        variants["compile"] = (None, lambda: compiled_runner(model), None)
    report, gates = {}, {}
    for name, (make, runner, path) in variants.items():
        report[name], gates[name] = publish_variant(name, eager, probe, rules, make, runner, path,
                                                    required=name == "onnx", labels=labels)
    report["exporter"] = rules.onnx_exporter
    report["probe_rows"] = len(probe)
    report["headline"] = "parity " + ", ".join(f"{name} {gate.status}" for name, gate in gates.items())
    write_json_atomic(paths.PARITY_REPORT, report)
    with stage_run(params.tracking, "export") as stage_log:
        stage_log.log_params(rules.model_dump())
        stage_log.log_metrics({f"{k}_bytes": v["bytes"] for k, v in report.items()
                               if isinstance(v, dict) and "bytes" in v})
        stage_log.set_tags({f"gate.parity.{name}": gate.status for name, gate in gates.items()})
        stage_log.log_artifact(str(paths.PARITY_REPORT))
    for name, gate in gates.items():
        if gate.status == "fail" and name != "onnx":
            log.error("%s is not published: %s", name, gate.summary())
    gates["onnx"].enforce()


if __name__ == "__main__":
    stage_main("export", run)
