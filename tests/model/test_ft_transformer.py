"""The FT-Transformer: learns, handles missing and unseen values, and exports with parity."""
from __future__ import annotations

import numpy as np
import torch

from models import build_model
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import onnx_runner
from tasks.modalities.table.probe import probe_rows
from tasks.training.loop import predict_logits, train_model
from tasks.variants.exporters import export_onnx
from tasks.variants.parity import check_parity

ARGS = {"d_token": 16, "layers": 1, "heads": 2, "dropout": 0.0}


def test_learns_beyond_the_majority_baseline(encoded, tiny_train):
    torch.manual_seed(0)
    model, history = train_model(build_model("ft_transformer", encoded.layout, **ARGS), encoded.train, encoded.val,
                                 tiny_train.model_copy(update={"epochs": 3, "lr": 0.003}))
    labels = encoded.val.labels.numpy()
    scores = classification_metrics(labels, predict_logits(model, encoded.val.features).argmax(1).numpy(), 2)
    majority = classification_metrics(labels, np.full_like(labels, np.bincount(labels).argmax()), 2)
    assert scores["f1_macro"] > majority["f1_macro"] + 0.05, (scores, majority)
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_exports_to_onnx_with_parity_on_edge_rows(encoded, tmp_path):
    torch.manual_seed(0)
    model = build_model("ft_transformer", encoded.layout, **ARGS).eval()
    probe = probe_rows(encoded.prepared.holdout, encoded.prepared.schema, 64)  # includes NaN and unseen codes
    path = tmp_path / "ft.onnx"
    export_onnx(model, encoded.prepared.schema, "legacy", path)
    with torch.no_grad():
        eager = model(torch.from_numpy(probe)).numpy()
    assert np.isfinite(eager).all()
    gate = check_parity("ft", eager, onnx_runner(path, 1)(probe), ExportParams())
    assert gate.status == "pass", gate.reasons
