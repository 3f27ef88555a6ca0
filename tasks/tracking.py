"""MLflow set-up, done explicitly by entry points (never at import time)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from tasks.config import TrackingParams

PARENT_RUN_ENV = "TORCHSHIP_PARENT_RUN_ID"


def configure_mlflow(tracking: TrackingParams) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns its id."""
    import mlflow

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = tracking.resolved_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        location = tracking.artifacts
        if "://" not in location:
            Path(location).mkdir(parents=True, exist_ok=True)
            location = Path(location).resolve().as_uri()
        experiment_id = mlflow.create_experiment(tracking.experiment, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


@contextlib.contextmanager
def stage_run(tracking: TrackingParams, stage: str, parent: str | None = None) -> Iterator["object"]:
    """An MLflow run for one stage, nested under the pipeline's run when there is one."""
    import mlflow

    configure_mlflow(tracking)
    parent = parent or os.environ.get(PARENT_RUN_ENV)
    tags = {"torchship.stage": stage}
    if parent:
        tags["mlflow.parentRunId"] = parent
    with mlflow.start_run(run_name=stage, tags=tags) as run:
        yield run


def open_pipeline_run(tracking: TrackingParams, tags: dict[str, str]) -> str:
    """The parent run of one pipeline run; stages nest under it (their subprocesses get its id by env)."""
    from mlflow import MlflowClient

    experiment_id = configure_mlflow(tracking)
    return MlflowClient().create_run(experiment_id, run_name="pipeline", tags=tags).info.run_id


def close_pipeline_run(tracking: TrackingParams, run_id: str, ok: bool, metrics: dict[str, float] | None = None,
                       summary_markdown: str | None = None) -> None:
    from mlflow import MlflowClient

    configure_mlflow(tracking)
    client = MlflowClient()
    for key, value in (metrics or {}).items():
        client.log_metric(run_id, key, value)
    if summary_markdown:
        client.log_text(run_id, summary_markdown, "summary.md")
    client.set_terminated(run_id, "FINISHED" if ok else "FAILED")
