"""Pretrained weights are hashed and loaded from the same bytes, read once (tasks/training/pretrained.py): a file
swapped for another right after its hash was checked is never what loads. And the pin is checked before any stage,
by the checks `torchship run` makes first (tasks/training/probe_process.py), not minutes later in baseline or train."""
from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tasks.core.params_spec import PretrainedParams
from tasks.training.pretrained import load_pretrained


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))   # a backbone and a head


def weights(path, seed: int) -> str:
    save_file(net(seed).state_dict(), str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_swapped_after_its_hash_was_checked_never_loads(tmp_path, monkeypatch):
    pinned, other = tmp_path / "weights.safetensors", tmp_path / "other.safetensors"
    digest = weights(pinned, 1)
    weights(other, 2)
    real_sha256, real_file_digest = hashlib.sha256, hashlib.file_digest

    def swap_after(digest_of):   # whichever way the pinned file is hashed, it is replaced right after
        def hashed(*args, **kwargs):
            result = digest_of(*args, **kwargs)
            if not swapped:
                swapped.append(True)
                pinned.write_bytes(other.read_bytes())
            return result
        return hashed

    swapped: list[bool] = []
    monkeypatch.setattr(hashlib, "sha256", swap_after(real_sha256))
    monkeypatch.setattr(hashlib, "file_digest", swap_after(real_file_digest))
    model = net(0)
    load_pretrained(model, PretrainedParams(path=str(pinned), sha256=digest))
    monkeypatch.undo()
    assert swapped, "the file was never hashed"
    torch.testing.assert_close(model[0].weight, net(1)[0].weight)   # the pinned weights, not the swapped-in ones


def test_a_wrong_pin_is_refused_by_the_checks_before_any_stage(tmp_path, monkeypatch):
    from tasks.training.probe_process import ProbeFailed, check_before_stages

    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    weights(tmp_path / "weights.safetensors", 1)
    pretrained = {"path": "weights.safetensors", "sha256": "0" * 64}
    with pytest.raises(ProbeFailed) as refused:
        check_before_stages({"train": {"pretrained": pretrained}}, "auto", pretrained["path"])
    message = str(refused.value)
    assert "not the pinned train.pretrained.sha256" in message and "was not loaded" in message, message
