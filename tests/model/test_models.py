"""models/: shapes, robustness to missing and unseen inputs, the registry."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models import FALLBACK_LR, MODELS, build_model, default_lr, model_modality
from models.cnn import ImageLayout
from models.tabular import FeatureLayout, TabularMLP
from models.text import TextLayout

LAYOUT = FeatureLayout(numeric_index=[0, 2], categorical_index=[1, 3], cardinalities=[3, 5],
                       numeric_mean=[10.0, -1.0], numeric_std=[2.0, 0.5], n_classes=4)
IMAGE_LAYOUT = ImageLayout(height=8, width=8, channels=1, mean=[0.3], std=[0.2], n_classes=3)
LAYOUTS = {"image": IMAGE_LAYOUT, "text": TextLayout(vocab_size=50, max_tokens=8, n_classes=3)}   # tables: LAYOUT


def rows(batch: int, seed: int = 0) -> torch.Tensor:
    """(B, 4) raw rows: numbers in columns 0 and 2, valid category codes in 1 and 3."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, generator=generator) * 3
    x[:, 1] = torch.randint(0, 4, (batch,), generator=generator).float()
    x[:, 3] = torch.randint(0, 6, (batch,), generator=generator).float()
    return x


@pytest.fixture
def model() -> TabularMLP:
    torch.manual_seed(0)
    return TabularMLP(LAYOUT, hidden=[16, 8], embedding_dim=3, dropout=0.0).eval()


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_logits_shape(model, batch):
    assert model(rows(batch)).shape == (batch, LAYOUT.n_classes)


def test_preprocessor_width(model):
    assert model.preprocess(rows(5)).shape == (5, 2 + 3 * 2)


def test_missing_numbers_are_imputed_with_the_training_mean(model):
    x = rows(6)
    with_nan = x.clone()
    with_nan[:, 0] = float("nan")
    with_mean = x.clone()
    with_mean[:, 0] = LAYOUT.numeric_mean[0]
    logits = model(with_nan)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, model(with_mean))


@pytest.mark.parametrize("code", [-3.0, 6.0, 1e6, float("nan")])
def test_unseen_negative_or_missing_codes_act_as_unknown(model, code):
    x = rows(6)
    odd, unknown = x.clone(), x.clone()
    odd[:, 3], unknown[:, 3] = code, 0.0
    logits = model(odd)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, model(unknown))


def test_known_codes_matter(model):
    x = rows(6)
    other = x.clone()
    other[:, 3] = (x[:, 3] % 5) + 1  # a different known category in every row
    assert not torch.allclose(model(x), model(other))


def test_all_missing_row_gives_finite_logits(model):
    assert torch.isfinite(model(torch.full((3, 4), float("nan")))).all()


def test_numbers_only_and_categories_only_layouts():
    numeric = FeatureLayout([0, 1], [], [], [0.0, 0.0], [1.0, 1.0], 2)
    categorical = FeatureLayout([], [0], [4], [], [], 3)
    assert TabularMLP(numeric, hidden=[4])(torch.randn(5, 2)).shape == (5, 2)
    assert TabularMLP(categorical, hidden=[4])(torch.tensor([[0.0], [4.0], [9.0]])).shape == (3, 3)


def test_build_model_constructs_registered_models():
    built = build_model("mlp", LAYOUT, hidden=[8])
    assert isinstance(built, TabularMLP)
    assert sum(isinstance(m, torch.nn.Linear) for m in built.modules()) == 2


def test_build_model_unknown_name_lists_the_known():
    with pytest.raises(KeyError) as caught:
        build_model("transformer", LAYOUT, hidden=[8])
    message = str(caught.value)
    assert "transformer" in message and all(name in message for name in MODELS)


def test_each_model_declares_its_config_and_learning_rate_and_its_defaults_build_it():
    for name, model in MODELS.items():
        config = model.Config()   # every hyper-parameter has a default in the model's own file
        layout = LAYOUTS.get(model_modality(name), LAYOUT)
        built = build_model(name, layout, **dataclasses.asdict(config))
        assert isinstance(built, model) and model.default_lr > 0 and default_lr(name) == model.default_lr
    assert isinstance(build_model("mlp", LAYOUT), TabularMLP)   # the constructor takes the same defaults
    assert (default_lr("mlp"), default_lr("ft_transformer")) == (3e-3, 1e-3)   # bench/results/auto_model.json
    assert default_lr("torch.nn:Identity") == FALLBACK_LR   # a model of yours that declares none


def test_a_config_refuses_values_its_model_cannot_take():
    with pytest.raises(ValueError, match="multiple of heads"):
        MODELS["ft_transformer"](LAYOUT, d_token=10, heads=4)
    with pytest.raises(ValueError, match="hidden"):
        MODELS["mlp"].Config(hidden=[])


def test_models_package_imports_no_pipeline_libraries():
    import subprocess
    import sys

    code = ("import sys, models; bad = [m for m in ('prefect', 'mlflow', 'dvc', 'great_expectations') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_layout_round_trips_as_a_dict():
    assert FeatureLayout(**LAYOUT.to_dict()) == LAYOUT
    assert math.isclose(LAYOUT.to_dict()["numeric_std"][1], 0.5)


def test_the_linear_model_is_a_softmax_regression_on_the_preprocessed_columns():
    torch.manual_seed(0)
    linear = build_model("linear", LAYOUT, embedding_dim=2).eval()
    layers = [m for m in linear.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 1 and layers[0].in_features == 2 + 2 * 2 and layers[0].out_features == 4
    x = rows(8)
    with torch.no_grad():
        assert torch.allclose(linear(x), layers[0](linear.preprocess(x)))   # nothing between the two
    with pytest.raises(ValueError, match="embedding_dim"):
        MODELS["linear"].Config(embedding_dim=0)


def test_the_periodic_mlp_embeds_each_number_on_its_own_and_exports(tmp_path):
    """mlp_plr: each standardised number goes through its own periodic -> linear -> ReLU embedding (so changing one
    column moves only that column's slice of the body's input), missing numbers still take the training mean, and
    the module exports to ONNX with the same logits."""
    import numpy as np
    import onnxruntime as ort

    torch.manual_seed(0)
    plr = build_model("mlp_plr", LAYOUT, hidden=[8], frequencies=4, numeric_dim=3, embedding_dim=2).eval()
    x = rows(16)
    numbers, _ = plr.preprocess.parts(x)
    moved = numbers.clone()
    moved[:, 1] += 1.0
    before, after = plr.periodic(numbers), plr.periodic(moved)
    assert before.shape == (16, 2 * 3) and torch.equal(before[:, :3], after[:, :3]) and \
        not torch.equal(before[:, 3:], after[:, 3:])
    with_nan = x.clone()
    with_nan[:, 0] = float("nan")
    assert torch.isfinite(plr(with_nan)).all()
    path = tmp_path / "plr.onnx"
    torch.onnx.export(plr, (x,), str(path), input_names=["x"], dynamo=False)
    exported = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(exported, plr(x).detach().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="sigma"):
        MODELS["mlp_plr"].Config(sigma=0.0)
