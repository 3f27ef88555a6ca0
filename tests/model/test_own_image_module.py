"""The own-module contract for images, checked on the probe batch (tasks/training/probe.py) in-process: each broken
class is refused naming the rule it breaks, and the worked example passes. The refusal through the real CLI, before
any stage runs, is tests/integration/test_images.py's."""
from __future__ import annotations

import pytest

from tasks.modalities.image.layout import model_probe as image_probe
from tasks.training.probe import ModelRuleBroken, probe_model

BROKEN = """
from torch import nn


class Floats(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.body = nn.Linear(layout.channels, layout.n_classes)

    def forward(self, x):          # forgets that its input is uint8 pixels
        return self.body(x.mean((1, 2)))


class WrongShape(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.body = nn.Linear(layout.channels, 3)

    def forward(self, x):
        return self.body(x.float().mean((1, 2)))


class NoLayout(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Linear(width, 3)

    def forward(self, x):
        return self.body(x.float().mean((1, 2)))
"""


@pytest.fixture
def broken(tmp_path, monkeypatch):
    (tmp_path / "own_broken_nets.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "own_broken_nets"


@pytest.mark.parametrize("cls, rule", [
    ("Floats", "forward(x) takes x (B, 8, 8, 1) uint8 pixels"),
    ("WrongShape", "forward returns one (B, n_classes) floating tensor of logits"),
    ("NoLayout", "constructed as Class(layout, **train.model_args[name])"),
])
def test_a_broken_image_module_is_refused_naming_the_rule(broken, cls, rule):
    with pytest.raises(ModelRuleBroken) as refused:
        probe_model(f"{broken}:{cls}", {}, image_probe(8, 8, 1, 10), export=False)
    assert rule in str(refused.value), str(refused.value)


def test_the_worked_example_meets_the_contract_and_exports():
    probe_model("docs.examples.own_image_model:TinyCNN", {}, image_probe(8, 8, 1, 10))   # raises if a rule breaks
