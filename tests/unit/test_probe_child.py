"""Your own module is probed before any stage in a child process with a wall-clock and a memory limit
(tasks/training/probe_process.py): a `forward` that sleeps is stopped at the limit and the frame it hung in named, one
that allocates past the limit is stopped by it; `torchship plan` (resolve) runs none of your code; a SyntaxError or
NameError in your module names its file and line under the rule "importable", not "constructed as"; and a manifest
whose first rows are missing or not images sizes the probe from the first image that reads (a clear error when none
does)."""
from __future__ import annotations

import io
import time

import pandas as pd
import pytest

from tasks.config import parse_params
from tasks.core.errors import TorchshipError

MODULE = """
import time

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.body = nn.Linear(5, layout.n_classes)

    def forward(self, x):
        return self.body(torch.nan_to_num(x))


class Sleepy(Net):
    def forward(self, x):
        time.sleep(600)   # a forward that never comes back
        return super().forward(x)


class Greedy(Net):
    def forward(self, x):
        hoard = torch.empty(1 << 30, dtype=torch.uint8)   # 1 GiB: over the probe's memory limit
        return super().forward(x) + hoard[:1].float()
"""


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "own_nets.py").write_text(MODULE)
    (tmp_path / "broken_nets.py").write_text("from torch import nn\n\n\nclass Net(nn.Module)\n    pass\n")
    (tmp_path / "naming_nets.py").write_text("from torch import nn\n\nWIDTH = undefined_width\n")
    (tmp_path / "marking_nets.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\nNet = None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_forward_that_sleeps_is_stopped_at_the_limit_naming_where(project):
    from tasks.training.probe_process import ProbeFailed, check_before_stages

    started = time.monotonic()
    with pytest.raises(ProbeFailed) as stopped:
        check_before_stages({"train": {"model": "own_nets:Sleepy"}}, "own_nets:Sleepy", None, seconds=2)
    message = str(stopped.value)
    assert "the probe ends within 2 s" in message and "own_nets:Sleepy" in message, message
    assert "in forward (" in message and "own_nets.py, line 19" in message, message
    assert time.monotonic() - started < 60   # the child's imports, then 2 s (it would sleep 600)


def test_a_forward_that_allocates_past_the_limit_is_stopped_by_it(project):
    from tasks.training.probe_process import ProbeFailed, check_before_stages

    with pytest.raises(ProbeFailed) as stopped:
        check_before_stages({"train": {"model": "own_nets:Greedy"}}, "own_nets:Greedy", None,
                            memory_bytes=512 << 20)
    message = str(stopped.value)
    assert "own_nets:Greedy" in message and "0.5 GiB of memory" in message, message


def test_plan_runs_none_of_your_code(project):
    from tasks.stages.overrides import resolve

    resolve(["train.model=marking_nets:Net"])
    assert not (project / "ran").exists(), "resolving the params imported the user's module"


@pytest.mark.parametrize("module, error, line", [("broken_nets", "SyntaxError", 4), ("naming_nets", "NameError", 3)])
def test_an_error_in_your_module_names_its_file_and_line(project, module, error, line):
    from tasks.training.probe import probe_own_model

    with pytest.raises(TorchshipError) as refused:
        probe_own_model(parse_params({"train": {"model": f"{module}:Net"}}))
    message = str(refused.value)
    assert "importable as package.module:Class" in message and "constructed as" not in message, message
    assert error in message and f"{module}.py, line {line}" in message, message


def png(side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_manifest_whose_first_rows_are_not_images_sizes_the_probe_from_the_first_that_is(project, monkeypatch):
    from tasks.training import probe

    (project / "notes.png").write_text("a text file named .png\n")
    (project / "real.png").write_bytes(png(12))
    manifest = project / "manifest.csv"
    params = parse_params({"data": {"source": str(manifest), "target": "label"}, "train": {"model": "own_nets:Net"}})
    rows = {"path": ["missing.png", "notes.png", "real.png"], "label": ["a", "b", "a"]}
    pd.DataFrame(rows).to_csv(manifest, index=False)
    seen = []
    monkeypatch.setattr(probe, "probe_model", lambda name, kwargs, made, export=True: seen.append(made))
    probe.probe_own_model(params)
    assert tuple(seen[0].inputs.shape[1:]) == (12, 12, 3)

    pd.DataFrame({key: values[:2] for key, values in rows.items()}).to_csv(manifest, index=False)
    with pytest.raises(TorchshipError) as refused:
        probe.probe_own_model(params)
    message = str(refused.value)
    assert "missing.png" in message and "notes.png" in message and "could be read as an image" in message, message
