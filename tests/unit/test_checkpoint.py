"""Checkpoints: newest intact one wins; damaged ones fall back; another run's are ignored."""
from __future__ import annotations

import logging

import torch

from tasks.training import checkpoint


def _state(step: int) -> dict:
    return {"step": step, "weights": torch.full((3,), float(step)), "nested": {"lr": 0.1, "history": [1.0, 2.0]}}


def test_newest_intact_checkpoint_is_loaded(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(tmp_path, step, _state(step), "run-a")
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-00000020.pt", "step-00000030.pt"]
    loaded = checkpoint.load_latest(tmp_path, "run-a")
    assert loaded["step"] == 30 and torch.equal(loaded["weights"], torch.full((3,), 30.0))
    assert not list(tmp_path.glob(".*tmp*")), "a temporary file was left behind"


def test_truncated_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, caplog):
    for step in (10, 20):
        checkpoint.save_checkpoint(tmp_path, step, _state(step), "run-a")
    newest = tmp_path / "step-00000020.pt"
    newest.write_bytes(newest.read_bytes()[:50])
    with caplog.at_level(logging.WARNING):
        loaded = checkpoint.load_latest(tmp_path, "run-a")
    assert loaded["step"] == 10
    assert "damaged" in caplog.text


def test_no_usable_checkpoint_means_a_fresh_start(tmp_path):
    checkpoint.save_checkpoint(tmp_path, 10, _state(10), "run-a")
    (tmp_path / "step-00000010.pt").write_bytes(b"garbage")
    assert checkpoint.load_latest(tmp_path, "run-a") is None


def test_checkpoints_of_another_run_are_ignored_and_cleared(tmp_path):
    checkpoint.save_checkpoint(tmp_path, 10, _state(10), "run-a")
    assert checkpoint.load_latest(tmp_path, "run-b") is None
    checkpoint.clear(tmp_path)
    assert not list(tmp_path.glob("step-*.pt"))


def test_checkpoint_files_load_without_unpickling_code(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path, 1, _state(1), "run-a")
    assert torch.load(path, weights_only=True)["nested"]["lr"] == 0.1
