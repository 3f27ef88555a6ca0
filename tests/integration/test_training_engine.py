"""The train stage under real torchrun: 1 vs 2 processes, FSDP vs DDP, kill -9 and resume, a dead rank named, a
hung rank caught by the collective timeout, out-of-memory halving. (Two nodes: tests/integration/test_two_nodes.py,
across network namespaces, against the weights of one node of two processes.)

A small MLP on a few thousand rows: every run costs mostly process start and the report, so runs that
several tests compare against are made once (`_metrics` caches them by their settings)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import BIN, make_project

pytestmark = pytest.mark.integration
TOLERANCE = 0.03  # macro-F1 points between process counts / strategies (different shards, same data)
# Every run writes these train.* keys plus its own, so no run depends on which test ran before it.
BASE = {"model": "mlp", "model_args": {"mlp": {"hidden": [16], "embedding_dim": 4}}, "epochs": 5, "batch_size": 64,
        "adapt": False, "nproc": 1, "nnodes": 1, "strategy": "ddp", "checkpoint_every": 25, "collective_timeout_s": 60,
        "threads": 1}
_runs: dict[str, dict] = {}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("engine"), {"data": {"rows": 6000}})
    _set(project)
    result = _stage(project, "prepare")
    assert result.returncode == 0, result.stderr
    return project


def _env(**extra: str) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true",
            **extra}


def _stage(project, stage: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", f"tasks.{stage}"], cwd=project.root, capture_output=True,
                            text=True, timeout=timeout, env=_env(**env))
    result.seconds = time.monotonic() - started
    return result


def _set(project, **train) -> None:
    """Write train = BASE + `train` into the project's params.yaml (validated first). model_args is
    replaced whole: the fixture's default teacher arguments do not belong to the MLP."""
    from ruamel.yaml import YAML

    from tasks.config import parse_params

    path = project.root / "params.yaml"
    yaml = YAML()
    document = yaml.load(path.read_text())
    document["train"].update({**BASE, **train})
    parse_params(json.loads(json.dumps(document)), origin=str(path))
    with path.open("w") as handle:
        yaml.dump(document, handle)


def _clear_checkpoints(project) -> None:
    for path in (project.root / "data/train/checkpoints").glob("*"):
        path.unlink()


def _train(project, **train) -> dict:
    _set(project, **train)
    _clear_checkpoints(project)
    result = _stage(project, "train")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    metrics = json.loads((project.root / "data/train/metrics.json").read_text())
    history = pd.read_csv(project.root / "data/train/history.csv")
    # The saved model is the best epoch's, not the last one's.
    assert argmax_f1(metrics) == pytest.approx(history["val_f1_macro"].max(), abs=1e-9)
    return metrics


def argmax_f1(metrics: dict) -> float:
    """Validation macro-F1 at the argmax: what the engine trained. A binary model's decision threshold is fitted on
    these same validation rows afterwards (its served score, `val_f1_macro`, moves with that fit, not with the
    engine), and records its score at 0.5 beside it."""
    return (metrics.get("decision") or {}).get("at_default", metrics["val_f1_macro"])


def _metrics(project, **train) -> dict:
    """A fresh run's metrics, made once per module for the same settings."""
    key = json.dumps(train, sort_keys=True)
    if key not in _runs:
        _runs[key] = _train(project, **train)
    return _runs[key]


def test_one_and_two_processes_reach_the_same_metric(project):
    one = _metrics(project, nproc=1)
    two = _metrics(project, nproc=2)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert abs(argmax_f1(one) - argmax_f1(two)) <= TOLERANCE


def test_fsdp_reaches_the_ddp_metric(project):
    ddp = _metrics(project, nproc=2)
    fsdp = _metrics(project, nproc=2, strategy="fsdp")
    assert fsdp["strategy"] == "fsdp" and fsdp["world_size"] == 2
    assert abs(argmax_f1(ddp) - argmax_f1(fsdp)) <= TOLERANCE


def test_kill_minus_nine_then_resume_matches_an_uninterrupted_run(project):
    uninterrupted = _metrics(project, nproc=1)
    # 4,200 rows / 64 = 66 steps an epoch: checkpoints at steps 25, 50, 75 (mid-epoch 2), then the worker
    # stalls at step 90 (TORCHSHIP_FAULT) so the whole job is surely mid-run when it is killed.
    _set(project)
    _clear_checkpoints(project)
    (project.root / "data/train/model.pt").unlink()
    job = subprocess.Popen([sys.executable, "-m", "tasks.train"], cwd=project.root, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True, env=_env(TORCHSHIP_FAULT="hang:0:90"))
    manifest = project.root / "data/train/checkpoints/manifest.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None and _newest_checkpoint(manifest) < 75:
        time.sleep(0.05)
    assert _newest_checkpoint(manifest) == 75, "the step-75 checkpoint was not written within 120 s"
    doomed = _process_tree(job.pid)  # launcher, torchrun and the worker, as when the machine goes down
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    job.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in doomed[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (project.root / "data/train/model.pt").exists(), "the run finished before it was killed"

    resumed = _stage(project, "train")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = "".join(re.sub(r"\[default\d+\]:", "", resumed.stdout + resumed.stderr).split())  # unwrap rich lines
    assert "resumingfrom" in logged and "step-00000075.pt" in logged, "the run started over instead of resuming"
    metrics = json.loads((project.root / "data/train/metrics.json").read_text())
    assert metrics["val_f1_macro"] == pytest.approx(uninterrupted["val_f1_macro"], abs=1e-6)
    assert metrics["val_accuracy"] == pytest.approx(uninterrupted["val_accuracy"], abs=1e-6)


def _process_tree(root: int) -> list[int]:
    """`root` and all its descendants: torchrun starts each worker in a session of its own, so killing
    the job's process group would leave the worker running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def _newest_checkpoint(manifest) -> int:
    try:
        return max((entry["step"] for entry in json.loads(manifest.read_text())["checkpoints"]), default=0)
    except (FileNotFoundError, ValueError):
        return 0


def test_a_rank_that_dies_fails_the_job_fast_naming_the_rank(project):
    _set(project, nproc=2)
    _clear_checkpoints(project)
    result = _stage(project, "train", TORCHSHIP_FAULT="kill:1:15")
    assert result.returncode != 0
    assert "rank 1 of the torchrun job failed first: killed by SIGKILL" in result.stderr, result.stderr[-3000:]
    assert result.seconds < 60, "the job hung instead of failing fast"


def test_a_rank_that_hangs_is_caught_by_the_collective_timeout(project):
    # Rank 1 stops answering at step 15; rank 0 waits in the next collective until the gloo timeout
    # (10 s) fails it. torchrun names rank 0, the rank whose collective timed out, as the root cause and
    # then stops rank 1 with SIGTERM: the message says both.
    _set(project, nproc=2, collective_timeout_s=10)
    _clear_checkpoints(project)
    result = _stage(project, "train", timeout=120, TORCHSHIP_FAULT="hang:1:15")
    assert result.returncode != 0
    assert ("rank 0 of the torchrun job failed first: a collective timed out after 10 s "
            "(train.collective_timeout_s) waiting for rank 1, which stopped answering") in result.stderr, \
        result.stderr[-3000:]
    assert 10 <= result.seconds < 60, "the job did not end by the 10 s collective timeout"


def test_out_of_memory_halves_the_micro_batch_and_keeps_training(project):
    _set(project, batch_size=256)
    _clear_checkpoints(project)
    result = _stage(project, "train", TORCHSHIP_FAULT="oom:0:3")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "micro-batch halved to 128" in output and "accumulating 2" in output
