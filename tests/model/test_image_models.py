"""The image models (models/cnn.py), the own-module contract's probe (tasks/training/probe.py) and the image
baselines (tasks/modalities/image/baseline.py), on tiny rendered and packaged sets."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

from models import build_model
from models.cnn import ImageLayout, ImageResNet, widths_for
from tasks.core.params_spec import BaselineParams
from tasks.modalities.image.baseline import MAJORITY, PIXELS, PROBE, downsampled, fit_and_predict, gate_baseline
from tasks.modalities.image.layout import model_probe as image_probe
from tasks.modalities.image.sources import packaged_digits, render_shapes
from tasks.modalities.table.layout import model_probe as table_probe
from tasks.training.probe import ModelRuleBroken, probe_model

LAYOUT = ImageLayout(height=16, width=16, channels=3, mean=[0.5] * 3, std=[0.25] * 3, n_classes=4)


def test_resnet_takes_raw_pixels_and_answers_logits_and_embeddings():
    model = ImageResNet(LAYOUT).eval()
    pixels = torch.randint(0, 256, (5, 16, 16, 3), dtype=torch.uint8)
    assert model(pixels).shape == (5, 4) and model.embed(pixels).shape == (5, widths_for(LAYOUT)[-1])


def test_normalisation_is_inside_the_model():
    """The preprocessor maps the training mean to 0 and one std above it to 1, per channel."""
    model = ImageResNet(LAYOUT)
    mean = torch.full((1, 2, 2, 3), 0.5 * 255)
    above = torch.full((1, 2, 2, 3), 0.75 * 255)
    torch.testing.assert_close(model.preprocess(mean), torch.zeros(1, 3, 2, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.preprocess(above), torch.ones(1, 3, 2, 2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("side, widths", [(8, [16, 32]), (16, [16, 32, 64]), (32, [16, 32, 64, 128]),
                                          (224, [16, 32, 64, 128])])
def test_widths_follow_the_image_size(side, widths):
    assert widths_for(ImageLayout(side, side, 1, [0.5], [0.2], 2)) == widths


@pytest.mark.parametrize("name", ["mlp", "linear", "mlp_plr", "ft_transformer"])
def test_every_table_model_meets_the_contract(name):
    probe_model(name, {}, table_probe(), export=name == "linear")


def test_the_image_model_meets_the_contract():
    probe_model("resnet", {}, image_probe(8, 8, 1))


BROKEN = '''
    import torch
    from torch import nn
    from models.cnn import ImagePreprocessor


    class NoNaN(nn.Module):
        """Written as a plain Linear over the rows: NaN in, NaN out."""
        def __init__(self, layout):
            super().__init__()
            self.body = nn.Linear(len(layout.numeric_index) + len(layout.categorical_index), layout.n_classes)
        def forward(self, x):
            return self.body(x)


    class WrongWidth(nn.Module):
        def __init__(self, layout):
            super().__init__()
            self.body = nn.Linear(5, 7)
        def forward(self, x):
            return self.body(torch.nan_to_num(x))


    class Branches(nn.Module):
        """Python control flow on a tensor's value: export cannot trace it, and rows depend on their batch."""
        def __init__(self, layout):
            super().__init__()
            self.body = nn.Linear(5, layout.n_classes)
        def forward(self, x):
            x = torch.nan_to_num(x)
            return self.body(x) if x.sum() > 0 else -self.body(x)


    class NamedRows(nn.Module):
        """Its input is called `rows`, not `x`: allowed (export passes it by position)."""
        def __init__(self, layout):
            super().__init__()
            self.body = nn.Linear(5, layout.n_classes)
        def forward(self, rows):
            return self.body(torch.nan_to_num(rows))


    class TwoArgs(nn.Module):
        def __init__(self, layout, depth):
            super().__init__()
            self.body = nn.Linear(5, layout.n_classes)
        def forward(self, x):
            return self.body(x)


    class Floats(nn.Module):
        """An image module that forgets its input is uint8."""
        def __init__(self, layout):
            super().__init__()
            self.body = nn.Linear(layout.channels, layout.n_classes)
        def forward(self, x):
            return self.body(x.mean((1, 2)))


    class Pixels(nn.Module):
        def __init__(self, layout):
            super().__init__()
            self.pre = ImagePreprocessor(layout)
            self.conv = nn.Conv2d(layout.channels, 4, 3, padding=1)
            self.fc = nn.Linear(4, layout.n_classes)
        def forward(self, x):
            return self.fc(self.conv(self.pre(x)).mean((2, 3)))
'''


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    (folder / "own_nets.py").write_text(textwrap.dedent(BROKEN))
    sys.path.insert(0, str(folder))
    yield "own_nets"
    sys.path.remove(str(folder))
    sys.modules.pop("own_nets", None)


@pytest.mark.parametrize("cls, rule", [("NoNaN", "finite logits"), ("WrongWidth", "(B, n_classes)"),
                                       ("Branches", "does not depend on the rows batched"),
                                       ("TwoArgs", "constructed as Class(layout"), ("Missing", "importable")])
def test_a_broken_table_module_fails_naming_its_rule(nets, cls, rule):
    with pytest.raises(ModelRuleBroken) as refusal:
        probe_model(f"{nets}:{cls}", {}, table_probe())
    assert rule in str(refusal.value) and "docs/own-model.md" in str(refusal.value)


def test_an_input_named_other_than_x_is_fine(nets):
    probe_model(f"{nets}:NamedRows", {}, table_probe())


def test_image_modules_take_uint8_pixels(nets):
    probe_model(f"{nets}:Pixels", {}, image_probe(12, 10, 3))
    with pytest.raises(ModelRuleBroken, match="uint8 pixels"):
        probe_model(f"{nets}:Floats", {}, image_probe(12, 10, 3))


def test_downsampling_averages_blocks():
    pixels = np.arange(4 * 32 * 32 * 3, dtype=np.int64).reshape(4, 32, 32, 3) % 256
    small = downsampled(pixels.astype(np.uint8))
    assert small.shape == (4, 16 * 16 * 3)
    assert downsampled(np.zeros((2, 8, 8, 1), np.uint8)).shape == (2, 64)   # digits stay 8x8


def test_pixel_regression_beats_the_majority_on_digits_and_a_probe_is_the_gate():
    pixels, labels = packaged_digits()
    y = np.array([int(v) for v in labels])
    train, holdout = slice(0, 1200), slice(1200, None)
    rules = BaselineParams(logistic_max_iter=300)
    results, predictions = fit_and_predict(pixels[train], y[train], pixels[holdout], y[holdout], 10, rules, False)
    assert results[PIXELS]["accuracy"] > 0.85 > results[MAJORITY]["accuracy"]
    assert predictions[PIXELS].shape == (len(y[holdout]),)
    assert gate_baseline(results, "accuracy") == PIXELS
    frozen = torch.nn.Linear(64, 16)   # a "backbone": fixed random features of the pixels
    with_probe, _ = fit_and_predict(pixels[train], y[train], pixels[holdout], y[holdout], 10, rules, False,
                                    features=lambda p: frozen(torch.from_numpy(p.reshape(len(p), -1) / 255.0)
                                                              .float()).detach().numpy())
    assert gate_baseline(with_probe, "accuracy") == PROBE   # the fine-tune is held to its own probe


def test_rendered_shapes_are_hard_for_pixels_but_not_hopeless():
    """Position, size, colour and rotation vary: a linear model of pixels learns little (a CNN's job), yet more than
    the majority class."""
    pixels, labels = render_shapes(800, seed=1)
    y = np.array([["circle", "cross", "square", "triangle"].index(v) for v in labels])
    results, _ = fit_and_predict(pixels[:600], y[:600], pixels[600:], y[600:], 4, BaselineParams(), False)
    assert results[PIXELS]["accuracy"] > results[MAJORITY]["accuracy"] + 0.05


def test_build_model_by_name():
    assert isinstance(build_model("resnet", LAYOUT, widths=[8, 16]), ImageResNet)
