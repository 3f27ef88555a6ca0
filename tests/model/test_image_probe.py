"""A broken own image module is refused by the probe (tasks/training/probe.py) before any stage runs, naming the
rule it breaks: the params resolved as `torchship run --set ...` resolves them, then the probe that run makes before
it writes params or starts a stage (there in a child process with limits, tasks/training/probe_process.py; here in
this one), on the packaged digits (8x8 grayscale, ten classes). A sound module passes."""
from __future__ import annotations

import textwrap

import pytest

from tasks.stages.overrides import resolve
from tasks.training.probe import ModelRuleBroken, probe_own_model

OWN = '''
    import torch
    from torch import nn
    from models.cnn import ImagePreprocessor


    class Sound(nn.Module):
        def __init__(self, layout):
            super().__init__()
            self.pre = ImagePreprocessor(layout)
            self.conv = nn.Conv2d(layout.channels, 4, 3, padding=1)
            self.fc = nn.Linear(4, layout.n_classes)
        def forward(self, pixels):
            return self.fc(self.conv(self.pre(pixels)).mean((2, 3)))


    class ExtraInput(Sound):
        """forward wants a second input that nothing will ever pass."""
        def forward(self, pixels, extra):
            return super().forward(pixels) + extra


    class NoLayout(nn.Module):
        """Built from nothing: the layout torchship passes has nowhere to go."""
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 10)
        def forward(self, x):
            return self.fc(x.flatten(1).float())


    class ClassCount(nn.Module):
        """Takes a class count where the layout is passed."""
        def __init__(self, n_classes: int):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)
        def forward(self, x):
            return self.fc(x.flatten(1).float())


    class Colour(Sound):
        """Written for RGB: three channels where the digits have one."""
        def __init__(self, layout):
            super().__init__(layout)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
'''


LAYOUT = "given is a models.cnn.ImageLayout (height, width, channels, mean, std, n_classes)"


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A project folder holding params.yaml (the packaged digits) and own_images.py; the module is imported from
    it as the probe imports a user's module."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("data:\n  source: images:digits\n")
    (tmp_path / "own_images.py").write_text(textwrap.dedent(OWN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    import sys

    sys.modules.pop("own_images", None)


def run_with(model: str):
    raw, params = resolve([f"train.model=own_images:{model}"], base_file="params.yaml")
    probe_own_model(params)
    return raw, params


def test_a_sound_image_module_passes_the_probe(project):
    _, params = run_with("Sound")
    assert params.train.model == "own_images:Sound"


@pytest.mark.parametrize("model, rule, detail", [
    ("ExtraInput", "rule: forward(x) takes x (B, 8, 8, 1) uint8 pixels", "missing 1 required positional argument"),
    ("NoLayout", "rule: constructed as Class(layout, **train.model_args[name])", LAYOUT),
    ("ClassCount", "rule: constructed as Class(layout, **train.model_args[name])", LAYOUT),
    ("Colour", "rule: forward(x) takes x (B, 8, 8, 1) uint8 pixels", "channels"),
])
def test_a_broken_image_module_is_refused_before_any_stage_naming_the_rule(project, model, rule, detail):
    with pytest.raises(ModelRuleBroken) as refusal:
        run_with(model)
    message = str(refusal.value)
    assert f"train.model own_images:{model} breaks the model contract, {rule}" in message
    assert detail in message and "nothing was trained" in message
    assert not (project / "data").exists()   # nothing was prepared
