"""The export gate with the default ONNX exporter, dynamo (torch.export based; tests/model/test_image_export.py uses
legacy, which is faster): an image model trained for a few seconds on real digits exports to a graph the parity gate
passes on real holdout images, and a wrong export of it, a perturbed convolution bias (the silent failure reported
for dynamo-exported ResNets in pytorch#166797), is refused. dynamo folds each batch norm into its convolution, so
every Conv of its graph carries a bias: the one to perturb."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from models import build_model
from tasks.core.params_spec import ExportParams, TrainParams
from tasks.core.runtime import onnx_runner
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.graph import probe_images
from tasks.modalities.image.layout import fit_image_layout
from tasks.modalities.image.sources import packaged_digits
from tasks.training.loop import Split, train_model
from tasks.variants.exporters import export_onnx
from tasks.variants.parity import check_parity

SCHEMA = Schema(source="images:digits", target="label", classes=[str(d) for d in range(10)], modality="image",
                inputs=ImageShape(height=8, width=8, channels=1, mode="L").model_dump())
RULES = ExportParams()   # the defaults, exporter included


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(eager model, the dynamo graph's bytes, holdout pixels, holdout labels)."""
    torch.manual_seed(0)
    pixels, labels = packaged_digits()
    y = torch.tensor([int(v) for v in labels])
    images = torch.from_numpy(pixels)
    train, val, holdout = slice(0, 1200), slice(1200, 1500), slice(1500, None)
    model = build_model("resnet", fit_image_layout(pixels[train], SCHEMA))
    settings = TrainParams(model="resnet", epochs=3, batch_size=64, lr=0.01, patience=3, seed=0)
    model, _ = train_model(model, Split(images[train], y[train]), Split(images[val], y[val]), settings, 10)
    path = tmp_path_factory.mktemp("dynamo") / "model.onnx"
    export_onnx(model.eval(), SCHEMA, RULES.onnx_exporter, path)
    return model, path.read_bytes(), pixels[holdout], y[holdout].numpy()


def gate_on(model, graph: bytes, holdout: np.ndarray, labels: np.ndarray):
    probe, chosen = probe_images(holdout, 200)
    with torch.no_grad():
        eager = model(torch.from_numpy(probe)).float().numpy()
    return check_parity("onnx", eager, onnx_runner(graph, 1)(probe), RULES, labels[chosen])


def test_the_default_exporter_is_dynamo_and_its_graph_passes_on_real_images(exported):
    model, graph, holdout, labels = exported
    assert RULES.onnx_exporter == "dynamo"
    assert {p.key: p.value for p in onnx.load_from_string(graph).metadata_props}["torchship.exporter"] == "dynamo"
    gate = gate_on(model, graph, holdout, labels)
    assert gate.status == "pass", gate.reasons
    with torch.no_grad():   # it learnt: the gate judges a model, not noise
        assert (model(torch.from_numpy(holdout)).argmax(1).numpy() == labels).mean() > 0.8


def test_a_perturbed_convolution_bias_is_refused(exported):
    model, graph, holdout, labels = exported
    proto = onnx.load_from_string(graph)
    biases = [node.input[2] for node in proto.graph.node if node.op_type == "Conv" and len(node.input) > 2]
    assert biases, "no Conv of the dynamo graph has a bias"
    bias = next(init for init in proto.graph.initializer if init.name == biases[0])
    values = numpy_helper.to_array(bias).copy()
    values += 0.5 * np.abs(values).mean() + 0.05   # every channel of the first convolution shifted a little
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    gate = gate_on(model, proto.SerializeToString(), holdout, labels)
    assert gate.status == "fail"
    assert "exceed atol" in gate.reasons[0]
