"""tasks/export.py: the ONNX file agrees with eager PyTorch, carries the schema, and the parity gate bites."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from models import build_model
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import onnx_runner
from tasks.core.schema_spec import schema_from_metadata
from tasks.modalities.table.probe import probe_rows
from tasks.training.loop import train_model as fit
from tasks.training.weights import model_spec
from tasks.variants.exporters import export_onnx
from tasks.variants.parity import check_parity

RULES = ExportParams(parity_atol=1e-4, min_argmax_agreement=0.999)
REPO = Path(__file__).resolve().parents[2]


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
    result = check_parity("onnx", reference, onnx_runner(onnx_file, 1)(probe), RULES)
    assert result.status == "pass", result.reasons


def test_onnx_batch_axis_is_dynamic(model, onnx_file, probe):
    run = onnx_runner(onnx_file, 1)
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


@pytest.fixture(scope="module")
def teacher(encoded):
    """The default data's teacher (`auto` picks the FT-Transformer there) at its params.yaml size, briefly trained."""
    from tasks.config import load_params

    torch.manual_seed(0)
    settings = load_params(REPO / "params.yaml").train.model_copy(update={"model": "ft_transformer", "epochs": 1,
                                                                          "batch_size": 256})
    spec = model_spec(settings)
    trained, _ = fit(build_model(spec["name"], encoded.layout, **spec["kwargs"]), encoded.train, encoded.val, settings)
    return trained.eval()


def test_the_default_teacher_passes_onnx_and_pt2_parity(teacher, encoded, probe, tmp_path):
    """torch.compile and the dynamo ONNX exporter (the defaults) cost ~90 s here: the session's pipeline run proves
    them through the real CLI (tests/integration/test_pipeline.py::test_every_variant_carries_its_proof)."""
    from tasks.variants.exporters import export_program
    from tasks.variants.parity import publish_variant
    from tasks.variants.runners import pt2_runner

    schema = encoded.prepared.schema
    reference = eager(teacher, probe)
    onnx_path, pt2_path = tmp_path / "t.onnx", tmp_path / "t.pt2"
    variants = {"onnx": (lambda: export_onnx(teacher, schema, "legacy", onnx_path), lambda: onnx_runner(onnx_path, 1),
                         onnx_path),
                "pt2": (lambda: export_program(teacher, schema, pt2_path), lambda: pt2_runner(pt2_path),
                        pt2_path)}
    for name, (make, runner, path) in variants.items():
        entry, gate = publish_variant(name, reference, probe, RULES, make, runner, path)
        assert gate.status == "pass", (name, gate.reasons)
        assert entry["publishable"]
        assert path is None or (entry["bytes"] == path.stat().st_size and len(entry["sha256"]) == 64)


def test_a_broken_onnx_export_is_not_publishable_and_names_the_diverging_rows(teacher, encoded, probe, tmp_path):
    from tasks.variants.parity import publish_variant

    broken = copy.deepcopy(teacher)
    with torch.no_grad():
        broken.head.weight[0, 0] += 0.5   # one weight of the classifier head
    path = tmp_path / "broken.onnx"
    entry, gate = publish_variant("onnx", eager(teacher, probe), probe, RULES,
                                  lambda: export_onnx(broken, encoded.prepared.schema, "legacy", path),
                                  lambda: onnx_runner(path, 1), path)
    assert gate.status == "fail" and not entry["publishable"]
    assert "probe rows exceed atol" in gate.reasons[0] and "(rows [" in gate.reasons[0]


def test_a_variant_that_cannot_be_built_is_not_published_but_onnx_must_build(probe):
    from tasks.variants.parity import publish_variant

    def broken():
        raise RuntimeError("inductor needs a C++ compiler")

    entry, gate = publish_variant("compile", np.zeros((len(probe), 2)), probe, RULES, broken, lambda: None)
    assert gate.status == "fail" and not entry["publishable"]
    assert "RuntimeError: inductor needs a C++ compiler" in gate.reasons[0]
    with pytest.raises(RuntimeError):
        publish_variant("onnx", np.zeros((len(probe), 2)), probe, RULES, broken, lambda: None, required=True)
