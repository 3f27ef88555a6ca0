"""The worked example of your own text module (docs/examples/own_text_model.py) through what the stages do, in
process: trained on generated tickets by the training engine, exported as the export stage exports (the module it
traces, logits and the embedding), composed behind the tokenizer as the served graph and held to the profile stage's
gate (the tokenization gate on every holdout text, then probability parity on raw strings), and the served graph
answers the holdout as well as eager does. The probe before any stage is tests/model/test_text_probe.py's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from docs.examples.own_text_model import TinyTextCNN
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import EMBEDDING, open_onnx
from tasks.modalities import modality_named
from tasks.modalities.interface import Holdout
from tasks.modalities.scoring import predict_proba
from tasks.modalities.text.graph import text_feed
from tasks.variants.exporters import export_onnx
from tests.helpers.text_tickets import tickets, trained

OWN = "docs.examples.own_text_model:TinyTextCNN"


@pytest.fixture(scope="module")
def data():
    return tickets(500, seed=5)


@pytest.fixture(scope="module")
def model(data):
    return trained(OWN, data, {"dim": 32})


def test_the_worked_example_learns_the_tickets(data, model):
    assert isinstance(model, TinyTextCNN)
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.ids("holdout"))).argmax(1).numpy()
    assert classification_metrics(data.labels["holdout"], predicted, 4)["f1_macro"] > 0.6   # chance: 0.25


def test_the_worked_example_exports_and_its_served_graph_passes_the_raw_parity_gate(data, model, tmp_path):
    text = modality_named("text")
    bare_path = tmp_path / "model.onnx"
    export_onnx(model, data.schema, "legacy", bare_path)
    bare = onnx.load(str(bare_path))
    assert [o.name for o in bare.graph.output] == ["logits", EMBEDDING]   # the monitor watches its own embedding
    served = text.compose(bare, data.schema).SerializeToString()
    texts = data.texts["holdout"]
    holdout = Holdout(rows=None, inputs=data.ids("holdout"), feed=text_feed(texts), labels=data.labels["holdout"])
    gate = text.raw_parity("onnx", open_onnx(bare_path, 1), open_onnx(served, 1), data.schema, holdout,
                           ExportParams(), served)
    assert gate.status == "pass", gate.reasons
    raw = predict_proba(open_onnx(served, 1), data.schema, text_feed(texts))
    with torch.no_grad():
        eager = torch.softmax(model(torch.from_numpy(data.ids("holdout"))), 1).numpy()
    np.testing.assert_allclose(raw, eager, atol=1e-5, rtol=0)
    assert eager.max(axis=1).mean() > 0.5   # a trained model: the comparison is not of uniform answers
