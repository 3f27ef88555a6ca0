"""Writing a model as ONNX (schema in its metadata) or as a torch.export program, atomically."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from tasks.core.artifacts import write_atomic
from tasks.core.runtime import THRESHOLD_KEY
from tasks.core.schema_spec import Schema
from tasks.modalities import modality_of

MAX_BATCH = 1 << 16


def export_example(schema: Schema) -> torch.Tensor:
    """What the exporters trace with: a small batch of the bare model's input, the modality's (4 zero rows (N, F)
    float32, 4 black images (N, H, W, C) uint8, ...)."""
    return modality_of(schema).export_example(schema)


def export_onnx(model: nn.Module, schema: Schema, exporter: str, path: Path, threshold: float | None = None) -> None:
    """ONNX with a dynamic batch axis; the schema (and a binary model's decision threshold) ride in metadata so the
    file is self-describing: the raw-input front turns the threshold into the graph's `decision` output. The modality
    says what is traced (an image model with its embedding projection as a second output). The input is passed by
    position, so a model's own name for it does not matter."""
    import onnx

    example = export_example(schema)
    traced, outputs = modality_of(schema).traced(model, example)

    def write(tmp: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):   # "torchvision is not installed", each pass
                    logging.getLogger(noisy).setLevel(logging.ERROR)
                program = torch.onnx.export(traced, (example,), dynamo=True, input_names=["x"], output_names=outputs,
                                            dynamic_shapes=({0: torch.export.Dim("batch", max=MAX_BATCH)},),
                                            verbose=False)
                unclash_outputs(program)
                program.save(str(tmp))
            else:
                torch.onnx.export(traced, (example,), str(tmp), dynamo=False, input_names=["x"],
                                  output_names=outputs, opset_version=17,
                                  dynamic_axes={name: {0: "batch"} for name in ["x", *outputs]})
        proto = onnx.load(str(tmp))
        onnx.checker.check_model(proto)
        metadata = {"torchship.schema": schema.model_dump_json(), "torchship.exporter": exporter}
        if threshold is not None:
            metadata[THRESHOLD_KEY] = repr(float(threshold))
        for key, value in metadata.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(proto, str(tmp))

    write_atomic(path, write)


def unclash_outputs(program) -> None:
    """torch's dynamo exporter names aten.embedding's result `embedding` (a model with an nn.Embedding: tables'
    categories, texts' tokens), then names a requested output `embedding` too: two values of one name, a graph the
    ONNX checker refuses. The inner value is renamed."""
    outputs = {id(value) for value in program.model.graph.outputs}
    names = {value.name for value in program.model.graph.outputs}
    for node in program.model.graph:
        for value in node.outputs:
            if value.name in names and id(value) not in outputs:
                value.name = f"{value.name}_inner"


def export_program(model: nn.Module, schema: Schema, path: Path) -> None:
    """A torch.export program (.pt2) with a dynamic batch dimension (the input passed by position)."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    program = torch.export.export(model, (export_example(schema),), dynamic_shapes=({0: batch},))
    write_atomic(path, lambda tmp: torch.export.save(program, str(tmp)))
