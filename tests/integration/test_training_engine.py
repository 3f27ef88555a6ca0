"""The train stage under real torchrun: 1 vs 2 processes, FSDP vs DDP, two nodes on loopback,
kill -9 and resume."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import BIN, make_project

pytestmark = pytest.mark.integration
TOLERANCE = 0.03  # macro-F1 points between process counts / strategies (different shards, same data)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("engine"), {"data": {"rows": 6000},
                                                              "train": {"epochs": 3, "checkpoint_every": 20}})
    result = _stage(project, "prepare")
    assert result.returncode == 0, result.stderr
    return project


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _stage(project, stage: str, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"tasks.{stage}"], cwd=project.root, capture_output=True, text=True,
                          timeout=600, env=_env(), **popen)


def _set(project, **train) -> None:
    from tasks.ops.overrides import resolve, write_params

    assignments = [f"train.{k}={json.dumps(v)}" for k, v in train.items()]
    raw, _ = resolve(assignments, base_file=str(project.root / "params.yaml"))
    write_params(raw, target=str(project.root / "params.yaml"))


def _train(project, **train) -> dict:
    _set(project, **train)
    result = _stage(project, "train")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads((project.root / "data/train/metrics.json").read_text())


def _clear_checkpoints(project) -> None:
    for path in (project.root / "data/train/checkpoints").glob("*"):
        path.unlink()


def test_one_and_two_processes_reach_the_same_metric(project):
    one = _train(project, nproc=1, strategy="ddp")
    two = _train(project, nproc=2, strategy="ddp")
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert abs(one["val_f1_macro"] - two["val_f1_macro"]) <= TOLERANCE


def test_fsdp_reaches_the_ddp_metric(project):
    ddp = _train(project, nproc=2, strategy="ddp")
    fsdp = _train(project, nproc=2, strategy="fsdp")
    assert fsdp["strategy"] == "fsdp"
    assert abs(ddp["val_f1_macro"] - fsdp["val_f1_macro"]) <= TOLERANCE


def test_two_nodes_on_loopback_form_one_job(project):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _set(project, nproc=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id=f"test-{port}", strategy="ddp")
    nodes = [subprocess.Popen([sys.executable, "-m", "tasks.train"], cwd=project.root, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    metrics = json.loads((project.root / "data/train/metrics.json").read_text())
    assert metrics["world_size"] == 2
    _set(project, nnodes=1)


def test_kill_minus_nine_then_resume_matches_an_uninterrupted_run(project):
    settings = {"nproc": 1, "strategy": "ddp", "batch_size": 32, "epochs": 3, "checkpoint_every": 50}
    _clear_checkpoints(project)
    uninterrupted = _train(project, **settings)

    _clear_checkpoints(project)
    (project.root / "data/train/model.pt").unlink()
    _set(project, **settings)
    job = subprocess.Popen([sys.executable, "-m", "tasks.train"], cwd=project.root, env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    manifest = project.root / "data/train/checkpoints/manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.02)
    assert manifest.exists(), "no checkpoint was written within 120 s"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
    assert not (project.root / "data/train/model.pt").exists(), "the run finished before it could be killed"

    resumed = _train(project, **settings)
    assert resumed["val_f1_macro"] == pytest.approx(uninterrupted["val_f1_macro"], abs=1e-6)
    assert resumed["val_accuracy"] == pytest.approx(uninterrupted["val_accuracy"], abs=1e-6)


def _failing_train(project, fault: str, **train) -> subprocess.CompletedProcess:
    _set(project, **train)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tasks.train"], cwd=project.root, capture_output=True, text=True,
                            timeout=300, env={**_env(), "TORCHSHIP_FAULT": fault})
    result.seconds = time.monotonic() - started
    return result


def test_a_rank_that_dies_fails_the_job_fast_naming_the_rank(project):
    _clear_checkpoints(project)
    result = _failing_train(project, "kill:1:15", nproc=2, strategy="ddp", collective_timeout_s=60, batch_size=512)
    assert result.returncode != 0
    assert "rank 1 of the torchrun job failed first" in result.stderr and "SIGKILL" in result.stderr, \
        result.stderr[-3000:]
    assert result.seconds < 60, "the job hung instead of failing fast"


def test_a_rank_that_hangs_is_caught_by_the_collective_timeout(project):
    _clear_checkpoints(project)
    result = _failing_train(project, "hang:1:15", nproc=2, strategy="ddp", collective_timeout_s=15, batch_size=512)
    assert result.returncode != 0
    assert "of the torchrun job failed first" in result.stderr, result.stderr[-3000:]
    assert result.seconds < 150


def test_out_of_memory_halves_the_micro_batch_and_keeps_training(project):
    _clear_checkpoints(project)
    _set(project, nproc=1, strategy="ddp", collective_timeout_s=300, batch_size=256)
    result = subprocess.run([sys.executable, "-m", "tasks.train"], cwd=project.root, capture_output=True, text=True,
                            timeout=300, env={**_env(), "TORCHSHIP_FAULT": "oom:0:3"})
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "micro-batch halved to 128" in output and "accumulating 2" in output
