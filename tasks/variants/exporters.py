"""Writing a model as ONNX (schema in its metadata) or as a torch.export program, atomically."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from tasks.contract import Schema
from tasks.core.artifacts import write_atomic
from tasks.core.runtime import THRESHOLD_KEY

MAX_BATCH = 1 << 16


def export_onnx(model: nn.Module, schema: Schema, exporter: str, path: Path, threshold: float | None = None) -> None:
    """ONNX with a dynamic batch axis; the schema (and a binary model's decision threshold) ride in metadata so the
    file is self-describing: the raw-row front turns the threshold into the graph's `decision` output."""
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
        metadata = {"torchship.schema": schema.model_dump_json(), "torchship.exporter": exporter}
        if threshold is not None:
            metadata[THRESHOLD_KEY] = repr(float(threshold))
        for key, value in metadata.items():
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
