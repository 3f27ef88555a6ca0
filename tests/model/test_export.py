"""tasks/export.py: the ONNX file agrees with eager PyTorch, carries the schema, and the parity gate bites."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch

from models import build_model
from tasks.config import ExportParams
from tasks.contract import schema_from_metadata
from tasks.export import check_parity, export_onnx, onnx_runner, probe_rows
from tasks.train import model_spec
from tasks.train_loop import train_model as fit

RULES = ExportParams(parity_atol=1e-4, min_argmax_agreement=0.999)


@pytest.fixture(scope="module")
def model(encoded, tiny_train):
    torch.manual_seed(0)
    spec = model_spec(tiny_train)
    built = build_model(spec["name"], encoded.layout, **spec["kwargs"])
    trained, _ = fit(built, encoded.train, encoded.val, tiny_train.model_copy(update={"epochs": 2}))
    return trained.eval()


@pytest.fixture(scope="module")
def probe(encoded):
    return probe_rows(encoded.prepared.holdout, encoded.prepared.schema, 64)


@pytest.fixture(scope="module")
def onnx_file(model, encoded, tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "model.onnx"
    export_onnx(model, encoded.prepared.schema, "legacy", path)
    return path


def eager(model, rows: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(rows)).numpy()


def test_probe_rows_add_edge_rows(encoded, probe):
    schema = encoded.prepared.schema
    assert probe.dtype == np.float32
    assert len(probe) == 64 + 1 + 2 * len(schema.features)  # sample + all-missing + two edges per feature
    assert np.isnan(probe[64]).all()
    plan = schema.feature_names.index("plan")
    assert -3 in probe[:, plan] and len(schema.features[plan].categories) + 7 in probe[:, plan]


def test_onnx_matches_eager_on_the_probe(model, onnx_file, probe):
    reference = eager(model, probe)
    assert np.isfinite(reference).all()
    result = check_parity("onnx", reference, onnx_runner(onnx_file)(probe), RULES)
    assert result.status == "pass", result.reasons


def test_onnx_batch_axis_is_dynamic(model, onnx_file, probe):
    run = onnx_runner(onnx_file)
    for batch in (1, 3, len(probe)):
        np.testing.assert_allclose(run(probe[:batch]), eager(model, probe[:batch]), rtol=1e-4, atol=1e-5)


def test_onnx_metadata_carries_the_schema(onnx_file, encoded):
    metadata = {p.key: p.value for p in onnx.load(str(onnx_file)).metadata_props}
    assert schema_from_metadata(metadata) == encoded.prepared.schema
    assert metadata["torchship.exporter"] == "legacy"


def test_a_perturbed_copy_fails_parity_naming_the_rows(model, probe):
    reference = eager(model, probe)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        perturbed.body[0].weight[0, 0] += 0.5  # one weight, the first numeric input of the first unit
    result = check_parity("tampered", reference, eager(perturbed, probe), RULES)
    assert result.status == "fail"
    assert "probe rows exceed atol" in result.reasons[0]
    diverging = np.flatnonzero((np.abs(reference - eager(perturbed, probe)) / np.maximum(1, np.abs(reference)))
                               .max(1) > RULES.parity_atol)
    assert f"rows {diverging[:10].tolist()}" in result.reasons[0]
    assert 0 < len(diverging) < len(probe)  # some rows, not a blanket failure


def test_parity_checks_argmax_agreement_separately():
    eager_logits = np.array([[1.0, 0.0]] * 100)
    variant = eager_logits.copy()
    variant[0] = [0.0, 1.0]
    result = check_parity("x", eager_logits, variant, ExportParams(parity_atol=10.0, min_argmax_agreement=0.999))
    assert result.status == "fail" and "argmax agreement 0.9900" in result.reasons[0]


def test_parity_tolerance_scales_with_large_logits():
    eager_logits = np.array([[1000.0, -1000.0], [0.5, 0.1]])
    variant = eager_logits + np.array([[0.05, -0.05], [0.0, 0.0]])  # 5e-5 relative on the large row
    assert check_parity("x", eager_logits, variant, RULES).status == "pass"
    variant[1, 0] += 1e-3
    assert check_parity("x", eager_logits, variant, RULES).status == "fail"
