"""Distillation and the accuracy budget: the student learns from soft targets, and a student that
barely trained is refused by the gate."""
from __future__ import annotations

import pytest
import torch

from models import build_model
from tasks.compress import accuracy_budget
from tasks.core.metrics import bootstrap_drop, predict
from tasks.core.params_spec import CompressParams
from tasks.training.loop import Split, distillation_loss, predict_logits, train_model
from tasks.training.weights import model_spec
from tasks.variants.runners import eager_runner

BUDGET = CompressParams(metric="f1_macro", max_drop=0.005, bootstrap=300)


@pytest.fixture(scope="module")
def teacher(encoded, tiny_train):
    torch.manual_seed(0)
    spec = model_spec(tiny_train)
    trained, _ = train_model(build_model(spec["name"], encoded.layout, **spec["kwargs"]), encoded.train, encoded.val,
                             tiny_train)
    return trained


def student_from(teacher, encoded, settings, soft_targets=(4.0, 0.9)):
    torch.manual_seed(0)
    soft = Split(encoded.train.features, encoded.train.labels, predict_logits(teacher, encoded.train.features))
    spec = model_spec(settings)
    student, history = train_model(build_model(spec["name"], encoded.layout, **spec["kwargs"]), soft, encoded.val,
                                   settings, soft_targets=soft_targets)
    return student, history


def gate(teacher, student, encoded):
    features, labels = encoded.val.features.numpy(), encoded.val.labels.numpy()
    drop = bootstrap_drop(labels, predict(eager_runner(teacher), features), predict(eager_runner(student), features),
                          2, BUDGET.metric, BUDGET.bootstrap)
    return accuracy_budget("student", drop, BUDGET), drop


def test_distillation_loss_is_zero_when_the_student_copies_the_teacher_with_alpha_one():
    hard = torch.nn.CrossEntropyLoss()
    logits, labels = torch.randn(16, 3), torch.randint(0, 3, (16,))
    assert distillation_loss(hard, 4.0, 1.0)(logits, labels, logits.clone()).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(hard, 4.0, 0.0)(logits, labels, torch.randn(16, 3)).item() == pytest.approx(
        hard(logits, labels).item())
    assert distillation_loss(hard, 2.0, 1.0)(logits, labels, -logits).item() > 0.1


def test_a_student_trained_for_one_step_is_rejected(teacher, encoded, tiny_train):
    one_step = tiny_train.model_copy(update={"model_args": {"mlp": {"hidden": [8]}}, "epochs": 1,
                                             "batch_size": len(encoded.train.labels), "warmup_fraction": 0.0})
    student, history = student_from(teacher, encoded, one_step)
    assert len(history) == 1
    result, drop = gate(teacher, student, encoded)
    assert result.status == "fail", result.reasons
    assert drop["low"] <= drop["high"]
    assert "> budget 0.50" in result.reasons[0]


def test_a_distilled_student_stays_close_to_its_teacher(teacher, encoded, tiny_train):
    student, _ = student_from(teacher, encoded, tiny_train.model_copy(update={"model_args": {"mlp": {"hidden": [16]}}}))
    _, drop = gate(teacher, student, encoded)
    assert drop["drop"] < 0.03, drop   # tiny data: a loose bound, the pipeline gate uses compress.max_drop


def test_static_int8_calibrated_on_raw_rows_keeps_the_predictions(teacher, encoded, tmp_path):
    from tasks.core.runtime import onnx_runner
    from tasks.variants.exporters import export_onnx
    from tasks.variants.quantize import quantize_onnx_static

    fp32, int8 = tmp_path / "m.onnx", tmp_path / "m.int8-static.onnx"
    export_onnx(teacher, encoded.prepared.schema, "legacy", fp32)
    quantize_onnx_static(fp32, int8, encoded.train.features.numpy()[:512])  # raw rows, missing values included
    features = encoded.val.features.numpy()
    agree = (predict(onnx_runner(fp32, 1), features) == predict(onnx_runner(int8, 1), features)).mean()
    assert agree > 0.95
    import onnx

    ops = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops  # the matrix products really run in int8
