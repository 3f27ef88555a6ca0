"""MLflow set-up, done explicitly by entry points (never at import time), and each stage's MLflow run.

A stage logs through the StageLog that `stage_run` gives it. Under `torchship run` the StageLog records the run in a
folder (STAGE_LOG_ENV) and the flow logs it once the stage ends (`replay_stage_log`): the flow process holds MLflow
already, and a stage process that never imports it saves about 2 CPU-s (the import and the store's set-up; prepare
on a small table: 3.7 -> 1.8 CPU-s). A stage run by plain `dvc repro` or by hand logs to MLflow itself."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tasks.core.env import MLFLOW_HTTP_RETRY, PARENT_RUN_ENV, STAGE_LOG_ENV, TELEMETRY_OFF, set_defaults
from tasks.core.params_spec import TrackingParams

RECORD = "record.json"


def is_uri(location: str) -> bool:
    """A URI (s3://bucket/x, file:///x, mlflow-artifacts:/x), not a folder path (a Windows drive letter is no
    scheme)."""
    return len(urlsplit(location).scheme) > 1


def configure_mlflow(tracking: TrackingParams) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns its id."""
    import mlflow

    set_defaults({**TELEMETRY_OFF, **MLFLOW_HTTP_RETRY})
    uri = tracking.resolved_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        location = tracking.artifacts   # None: the server's default, mlflow-artifacts:/<experiment id>
        if location is not None and not is_uri(location):
            Path(location).mkdir(parents=True, exist_ok=True)
            location = Path(location).resolve().as_uri()
        experiment_id = mlflow.create_experiment(tracking.experiment, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


class DirectLog:
    """A stage's logging calls, straight to MLflow's active run (`info`: that run's)."""

    def __init__(self, run):
        import mlflow

        self.mlflow, self.info = mlflow, run.info

    def log_params(self, params: dict) -> None:
        self.mlflow.log_params(params)

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def set_tags(self, tags: dict) -> None:
        self.mlflow.set_tags(tags)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifact(path, artifact_path=artifact_path)

    def log_artifacts(self, folder: str, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifacts(folder, artifact_path=artifact_path)

    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        self.mlflow.log_dict(dictionary, artifact_file)


class RecordedLog:
    """The same calls, kept in a folder of their own under `folder` (files copied at once: a stage may log a
    temporary file) for the flow to log with replay_stage_log; values are kept as MLflow stores them (params as
    text, metrics as floats). A stage process may record several runs (compress: its own and its student's)."""

    def __init__(self, folder: Path, stage: str):
        self.folder = folder / f"{time.time_ns()}-{os.getpid()}"
        self.folder.mkdir(parents=True)
        self.record = {"stage": stage, "start_ms": _now_ms(), "params": {}, "metrics": [], "tags": {},
                       "artifacts": []}

    def log_params(self, params: dict) -> None:
        self.record["params"].update({key: str(value) for key, value in params.items()})

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        now = _now_ms()
        self.record["metrics"] += [[key, float(value), now, step or 0] for key, value in metrics.items()]

    def set_tags(self, tags: dict) -> None:
        self.record["tags"].update({key: str(value) for key, value in tags.items()})

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        kept = self._slot() / Path(path).name
        shutil.copy2(path, kept)
        self.record["artifacts"].append([str(kept), artifact_path])

    def log_artifacts(self, folder: str, artifact_path: str | None = None) -> None:
        kept = self._slot() / "files"
        shutil.copytree(folder, kept)
        self.record["artifacts"].append([str(kept), artifact_path])

    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        kept = self._slot() / Path(artifact_file).name
        kept.write_text(json.dumps(dictionary, indent=2))
        self.record["artifacts"].append([str(kept), str(Path(artifact_file).parent) if "/" in artifact_file else None])

    def finish(self, status: str) -> None:
        self.record.update(status=status, end_ms=_now_ms())
        (self.folder / f"{RECORD}.tmp").write_text(json.dumps(self.record))
        (self.folder / f"{RECORD}.tmp").replace(self.folder / RECORD)

    def _slot(self) -> Path:
        slot = self.folder / f"artifact-{len(self.record['artifacts'])}"
        slot.mkdir(parents=True)
        return slot


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextlib.contextmanager
def stage_run(tracking: TrackingParams, stage: str, parent: str | None = None) -> Iterator[DirectLog | RecordedLog]:
    """One stage's MLflow run, nested under the pipeline's run when there is one: recorded for the flow to log
    when it set STAGE_LOG_ENV, else logged here. A block that raises leaves a FAILED run either way."""
    if os.environ.get(STAGE_LOG_ENV) and parent is None:
        recorded = RecordedLog(Path(os.environ[STAGE_LOG_ENV]), stage)
        try:
            yield recorded
        except BaseException:
            recorded.finish("FAILED")
            raise
        recorded.finish("FINISHED")
        return
    import mlflow

    configure_mlflow(tracking)
    with mlflow.start_run(run_name=stage, parent_run_id=parent or os.environ.get(PARENT_RUN_ENV),
                          tags={"torchship.stage": stage}) as run:
        yield DirectLog(run)


def replay_stage_log(tracking: TrackingParams, folder: Path, parent: str) -> list[str]:
    """Log the runs a stage recorded under `folder` (RecordedLog) under the pipeline's run `parent`, in the order
    they began, each with its own start and end times; the new runs' ids (none when the stage recorded nothing: it
    was killed, or failed before its run began)."""
    records = sorted(folder.glob(f"*/{RECORD}"), key=lambda path: path.parent.name) if folder.is_dir() else []
    return [_replay(tracking, json.loads(path.read_text()), parent) for path in records]


def _replay(tracking: TrackingParams, record: dict, parent: str) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    tags = {"mlflow.parentRunId": parent, "torchship.stage": record["stage"], **record["tags"]}
    run_id = client.create_run(configure_mlflow(tracking), start_time=record["start_ms"], tags=tags,
                               run_name=record["stage"]).info.run_id
    params = [Param(key, value) for key, value in record["params"].items()]
    metrics = [Metric(key, value, at, step) for key, value, at, step in record["metrics"]]
    for start in range(0, max(len(params), len(metrics)), 100):   # MLflow takes 100 params a batch
        client.log_batch(run_id, metrics=metrics[start:start + 100], params=params[start:start + 100])
    for path, artifact_path in record["artifacts"]:
        if Path(path).is_dir():
            client.log_artifacts(run_id, path, artifact_path)
        else:
            client.log_artifact(run_id, path, artifact_path)
    client.set_terminated(run_id, record["status"], end_time=record["end_ms"])
    return run_id


@contextlib.contextmanager
def pipeline_run(tracking: TrackingParams, tags: dict[str, str]) -> Iterator[str]:
    """The parent MLflow run of one pipeline run (stages nest under it; their subprocesses get its id by
    env): FINISHED when the block completes, FAILED when it raises."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    run_id = client.create_run(configure_mlflow(tracking), run_name="pipeline", tags=tags).info.run_id
    try:
        yield run_id
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def log_run_text(tracking: TrackingParams, run_id: str, text: str, artifact_file: str) -> None:
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=tracking.resolved_uri()).log_text(run_id, text, artifact_file)
