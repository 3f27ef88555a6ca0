"""A stage's MLflow run, recorded by the stage process (which then never loads MLflow) and logged by the flow
(tasks/core/tracking.py): the logged run holds what the stage logged, nested under the pipeline's run, with the
stage's own times and status, whether or not the files it logged still exist."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.core.env import STAGE_LOG_ENV
from tasks.core.params_spec import TrackingParams
from tasks.core.tracking import configure_mlflow, replay_stage_log, stage_run
from tests.conftest import REPO


@pytest.fixture
def store(tmp_path):
    """(tracking params on a SQLite store of its own, a client on it, the pipeline's parent run id)."""
    from mlflow import MlflowClient

    tracking = TrackingParams(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifacts=str(tmp_path / "artifacts"))
    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    parent = client.create_run(configure_mlflow(tracking), run_name="pipeline").info.run_id
    return tracking, client, parent


def record(tracking, folder, monkeypatch, tmp_path, fail: bool = False) -> None:
    """What the train stage logs, through stage_run with STAGE_LOG_ENV set; the temporary file it logs is gone
    before the flow logs the run."""
    monkeypatch.setenv(STAGE_LOG_ENV, str(folder))
    plots, temporary = tmp_path / "plots", tmp_path / "gone.txt"
    plots.mkdir(exist_ok=True)
    (plots / "curve.png").write_bytes(b"png")
    temporary.write_text("kept at once")
    with stage_run(tracking, "train") as stage_log:
        stage_log.log_params({"lr": 0.01, "model": "mlp"})
        for step in (1, 2):
            stage_log.log_metrics({"val_f1": 0.5 + step / 10}, step=step)
        stage_log.set_tags({"gate.status": "pass"})
        stage_log.log_artifacts(str(plots), artifact_path="plots")
        stage_log.log_artifact(str(temporary))
        stage_log.log_dict({"fitted": True}, "fitted_training.json")
        if fail:
            raise RuntimeError("the stage failed")
    temporary.unlink()


def test_the_flow_logs_what_the_stage_recorded_under_the_pipeline_run(store, tmp_path, monkeypatch):
    tracking, client, parent = store
    record(tracking, tmp_path / "record", monkeypatch, tmp_path)
    [run_id] = replay_stage_log(tracking, tmp_path / "record", parent)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "train"
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["torchship.stage"] == "train"
    assert run.data.tags["gate.status"] == "pass"
    assert run.data.params == {"lr": "0.01", "model": "mlp"}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val_f1")] == [(1, 0.6), (2, 0.7)]
    assert run.info.start_time <= run.info.end_time
    logged = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert logged >= {"plots/curve.png", "gone.txt", "fitted_training.json"}
    kept = Path(client.download_artifacts(run_id, "fitted_training.json", str(tmp_path / "down")))
    assert json.loads(kept.read_text()) == {"fitted": True}


def test_a_stage_that_failed_leaves_a_failed_run_and_one_that_recorded_nothing_none(store, tmp_path, monkeypatch):
    tracking, client, parent = store
    with pytest.raises(RuntimeError):
        record(tracking, tmp_path / "record", monkeypatch, tmp_path, fail=True)
    [run_id] = replay_stage_log(tracking, tmp_path / "record", parent)
    assert client.get_run(run_id).info.status == "FAILED"
    assert replay_stage_log(tracking, tmp_path / "killed", parent) == []   # killed before its run began


def test_a_recording_stage_process_never_imports_mlflow(tmp_path):
    script = ("import sys\n"
              "from tasks.core.params_spec import TrackingParams\n"
              "from tasks.core.tracking import stage_run\n"
              "with stage_run(TrackingParams(uri='sqlite:///unused.db'), 'prepare') as log:\n"
              "    log.log_metrics({'rows': 3})\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, STAGE_LOG_ENV: str(tmp_path / "record"), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not (tmp_path / "unused.db").exists()
