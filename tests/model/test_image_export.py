"""An image model through export (tasks/variants/exporters.py, tasks/modalities/image/graph.py): trained for a few
seconds on
real digits, exported to ONNX, gated on parity with eager on real holdout images (top-1 agreement and the accuracy
delta, not only allclose on random tensors), composed into the served graph, and quantised to static int8. A
deliberately wrong export, a perturbed convolution (the failure of pytorch#166797), is refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from models import build_model
from tasks.core.params_spec import ExportParams, TrainParams
from tasks.core.runtime import EMBEDDING, onnx_runner, open_onnx
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.graph import compose_image_model, probe_images
from tasks.modalities.image.layout import fit_image_layout
from tasks.modalities.image.sources import packaged_digits
from tasks.training.loop import Split, train_model
from tasks.variants.exporters import export_onnx
from tasks.variants.parity import check_parity
from tasks.variants.quantize import quantize_onnx_static

SCHEMA = Schema(source="images:digits", target="label", classes=[str(d) for d in range(10)], modality="image",
                inputs=ImageShape(height=8, width=8, channels=1, mode="L").model_dump())
RULES = ExportParams(onnx_exporter="legacy")


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    pixels, labels = packaged_digits()
    y = torch.tensor([int(v) for v in labels])
    images = torch.from_numpy(pixels)
    train, val, holdout = slice(0, 1200), slice(1200, 1500), slice(1500, None)
    layout = fit_image_layout(pixels[train], SCHEMA)
    model = build_model("resnet", layout)
    settings = TrainParams(model="resnet", epochs=4, batch_size=64, lr=0.01, patience=4, seed=0)
    model, _ = train_model(model, Split(images[train], y[train]), Split(images[val], y[val]), settings, 10)
    return model.eval(), pixels[holdout], y[holdout].numpy(), pixels[train]


def eager_logits(model, pixels: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(pixels)).float().numpy()


def test_the_exported_graph_answers_as_eager_on_real_holdout_images(trained, tmp_path):
    model, holdout, labels, _ = trained
    path = tmp_path / "model.onnx"
    export_onnx(model, SCHEMA, "legacy", path)
    probe, chosen = probe_images(holdout, 200)
    gate = check_parity("onnx", eager_logits(model, probe), onnx_runner(path, 1)(probe), RULES, labels[chosen])
    assert gate.status == "pass", gate.reasons
    assert (eager_logits(model, holdout).argmax(1) == labels).mean() > 0.8   # it learnt: the gate judges a model


def test_a_perturbed_convolution_is_refused(trained, tmp_path):
    model, holdout, labels, _ = trained
    path = tmp_path / "model.onnx"
    export_onnx(model, SCHEMA, "legacy", path)
    proto = onnx.load(str(path))
    convs = {node.input[1] for node in proto.graph.node if node.op_type == "Conv"}
    weight = next(init for init in proto.graph.initializer if init.name in convs)
    values = numpy_helper.to_array(weight).copy()
    values[0] *= 1.5   # one output channel of one convolution scaled: plausible, silent, wrong
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(proto, str(path))
    probe, chosen = probe_images(holdout, 200)
    gate = check_parity("onnx", eager_logits(model, probe), onnx_runner(path, 1)(probe), RULES, labels[chosen])
    assert gate.status == "fail" and "exceed atol" in gate.reasons[0]


def test_the_served_graph_takes_raw_pixels_and_outputs_the_embedding(trained, tmp_path):
    model, holdout, _, _ = trained
    path = tmp_path / "model.onnx"
    export_onnx(model, SCHEMA, "legacy", path)
    composed = open_onnx(compose_image_model(onnx.load(str(path)), SCHEMA).SerializeToString(), 1)
    assert [i.name for i in composed.get_inputs()] == ["image"]
    probabilities, embedding = composed.run(["probabilities", EMBEDDING], {"image": holdout[:16]})
    np.testing.assert_allclose(probabilities.sum(1), 1.0, rtol=1e-5)
    assert embedding.shape == (16, 16)
    torch.testing.assert_close(torch.from_numpy(probabilities),
                               torch.softmax(torch.from_numpy(eager_logits(model, holdout[:16])), 1), atol=1e-5, rtol=0)


def test_static_int8_with_convolutions_keeps_the_answers(trained, tmp_path):
    model, holdout, labels, train = trained
    path, int8 = tmp_path / "model.onnx", tmp_path / "model.int8.onnx"
    export_onnx(model, SCHEMA, "legacy", path)
    quantize_onnx_static(path, int8, train[:512])
    quantized = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert "QuantizeLinear" in quantized and "DequantizeLinear" in quantized
    fp32, q = onnx_runner(path, 1)(holdout), onnx_runner(int8, 1)(holdout)
    assert abs((fp32.argmax(1) == labels).mean() - (q.argmax(1) == labels).mean()) < 0.03
    assert int8.stat().st_size < path.stat().st_size
