"""MLflow set-up, done explicitly by entry points (never at import time)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tasks.core.env import MLFLOW_HTTP_RETRY, PARENT_RUN_ENV, TELEMETRY_OFF, set_defaults
from tasks.core.params_spec import TrackingParams


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


@contextlib.contextmanager
def stage_run(tracking: TrackingParams, stage: str, parent: str | None = None) -> Iterator[object]:
    """An MLflow run for one stage, nested under the pipeline's run when there is one."""
    import mlflow

    configure_mlflow(tracking)
    with mlflow.start_run(run_name=stage, parent_run_id=parent or os.environ.get(PARENT_RUN_ENV),
                          tags={"torchship.stage": stage}) as run:
        yield run


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
