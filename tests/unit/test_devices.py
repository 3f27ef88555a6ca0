"""What a training job decides from the devices it finds (tasks/training/distributed.py, tasks/training/run.py): more
processes than GPUs are refused before torchrun starts, TF32 for fp32 on a GPU, FSDP with one process trains as DDP,
nothing compiles when train.compile is false. A CPU machine has no GPU to count, so the GPU count is faked here
(torch.cuda's own two functions); everything after it is the real code."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tasks.core.env import COMPILE_DISABLE_ENV, STAGE_STARTED_ENV
from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params, TrainParams
from tasks.training import run as run_module
from tasks.training.distill import student_settings
from tasks.training.distributed import check_processes_fit, device_kind, processes_problem, resolve_strategy, tf32_note
from tasks.training.job import TrainingJob
from tasks.training.run import launch
from tasks.training.timeline import Timeline, process_started_at


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


class TorchrunStarted(Exception):
    """The fake Popen's answer: torchrun would have started here, with this environment."""


@pytest.fixture
def started(monkeypatch) -> list[dict]:
    """The environments torchrun was started with (none: it was never started)."""
    calls = []

    def popen(command, env=None, **kwargs):
        calls.append(env)
        raise TorchrunStarted()

    monkeypatch.setattr(run_module.subprocess, "Popen", popen)
    return calls


def a_job(tmp_path: Path, **train) -> TrainingJob:
    settings = TrainParams(model="mlp", **train)
    return TrainingJob("train", settings, {"name": "mlp", "kwargs": {}}, tmp_path / "model.pt", tmp_path / "ckpt",
                       tmp_path, tmp_path / "logs")


def test_more_processes_than_gpus_name_the_count_and_the_fix():
    message = processes_problem(2, 1)
    assert message.startswith("train.nproc is 2, but this node has 1 GPU: each training process needs a GPU of its "
                              "own"), message
    assert "--set train.nproc=1" in message and "CUDA_VISIBLE_DEVICES" in message
    assert "has 4 GPUs" in processes_problem(8, 4)
    assert processes_problem(2, 2) is None and processes_problem(1, 8) is None
    assert processes_problem(8, 0) is None   # on the CPU (gloo) any count runs


def test_the_check_counts_this_node_s_gpus(monkeypatch):
    fake_gpus(monkeypatch, 1)
    assert device_kind() == "cuda"
    with pytest.raises(ConfigError, match="train.nproc is 2, but this node has 1 GPU"):
        check_processes_fit(TrainParams(nproc=2))
    check_processes_fit(TrainParams(nproc=1))
    fake_gpus(monkeypatch, 0)
    assert device_kind() == "cpu"
    check_processes_fit(TrainParams(nproc=4))


@pytest.mark.parametrize("train", [{"nproc": 2}, {"nproc": 2, "nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400"}],
                         ids=["one node", "each node of several"])
def test_too_many_processes_are_refused_before_torchrun_starts(monkeypatch, tmp_path, started, train):
    fake_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match="this node has 1 GPU"):
        launch(a_job(tmp_path, **train))
    assert started == []


def test_the_distilled_student_is_checked_like_the_teacher(monkeypatch, tmp_path, started):
    fake_gpus(monkeypatch, 1)
    settings = student_settings(Params(train=TrainParams(nproc=2)))   # the student trains with train.nproc
    with pytest.raises(ConfigError, match="train.nproc is 2"):
        launch(TrainingJob("distill", settings, {"name": "mlp", "kwargs": {}}, tmp_path / "s.pt", tmp_path / "c",
                           tmp_path, tmp_path / "logs", module="tasks.training.distill"))
    assert started == []


def test_on_the_cpu_nothing_changes(monkeypatch, tmp_path, started):
    fake_gpus(monkeypatch, 0)
    with pytest.raises(TorchrunStarted):
        launch(a_job(tmp_path, nproc=2))
    assert len(started) == 1


def test_without_train_compile_nothing_in_the_workers_compiles(monkeypatch, tmp_path, started):
    fake_gpus(monkeypatch, 0)
    monkeypatch.delenv(COMPILE_DISABLE_ENV, raising=False)
    for compile_model in (False, True):
        with pytest.raises(TorchrunStarted):
            launch(a_job(tmp_path, compile=compile_model))
    off, on = started
    assert off[COMPILE_DISABLE_ENV] == "1" and COMPILE_DISABLE_ENV not in on
    assert float(off[STAGE_STARTED_ENV]) <= time.time()   # the workers' timeline origin: this process's start


def test_fp32_on_an_ampere_or_later_gpu_uses_tf32_with_a_note():
    assert "TF32" in tf32_note("fp32", "cuda", (9, 0)) and "parity" in tf32_note("fp32", "cuda", (8, 0))
    assert tf32_note("fp32", "cuda", (7, 5)) == ""   # no TF32 before Ampere
    assert tf32_note("bf16", "cuda", (9, 0)) == "" and tf32_note("fp32", "cpu", None) == ""


def test_fsdp_with_one_process_trains_as_ddp_with_a_note():
    strategy, note = resolve_strategy("fsdp", 1)
    assert strategy == "ddp" and "shards nothing" in note
    assert resolve_strategy("fsdp", 2) == ("fsdp", "") and resolve_strategy("ddp", 1) == ("ddp", "")


def test_the_timeline_counts_from_the_stage_s_start(monkeypatch):
    started = process_started_at()
    assert started is not None and started <= time.time()
    monkeypatch.setenv(STAGE_STARTED_ENV, str(time.time() - 5.0))
    timeline = Timeline()
    timeline.mark("loaded")
    marks = timeline.seconds()
    assert 5.0 <= marks["loaded"] < 6.0 and marks["worker_started"] <= marks["loaded"]
    assert process_started_at(os.getpid()) == pytest.approx(started, abs=0.05)


def test_the_model_card_names_the_gpu_its_memory_and_the_rate():
    from tasks.registry.model_card import device_line

    on_gpu = device_line({"device_name": "NVIDIA H200", "samples_per_s": 76_400.2, "peak_device_memory_mb": 1893.4,
                          "notes": ["fp32 on this GPU: matmuls and convolutions in TF32"]})
    assert on_gpu == ("NVIDIA H200, 76,400 samples/s, peak GPU memory 1,893 MB; fp32 on this GPU: matmuls and "
                      "convolutions in TF32")
    on_cpu = device_line({"device": "cpu", "samples_per_s": 7074.0, "peak_device_memory_mb": None, "peak_rss_mb": 518})
    assert on_cpu == "cpu, 7,074 samples/s, peak resident memory 518 MB summed over ranks"
