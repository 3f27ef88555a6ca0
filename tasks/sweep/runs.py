"""The study in MLflow: one parent run per study (found again by its tag when the study resumes), a child per trial
with its values, score, state, the stages it ran or reused and why it failed, and the parent's images: the
parallel-coordinates plot and the parameter importances (Optuna's matplotlib backends)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from tasks.core.params_spec import TrackingParams
from tasks.core.tracking import configure_mlflow

STUDY_TAG, TRIAL_TAG = "torchship.sweep.study", "torchship.sweep.trial"
STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED", "RUNNING": "RUNNING", "WAITING": "SCHEDULED"}


def study_run(tracking: TrackingParams, study: str) -> str:
    """The study's parent run: the one tagged with its name, or a new one."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    experiment = configure_mlflow(tracking)
    found = [run for run in client.search_runs([experiment], f"tags.`{STUDY_TAG}` = '{study}'", max_results=5000)
             if TRIAL_TAG not in run.data.tags]
    if found:
        return found[0].info.run_id
    return client.create_run(experiment, run_name=f"sweep {study}", tags={STUDY_TAG: study}).info.run_id


def log_trials(tracking: TrackingParams, parent: str, study: str, rows: list[dict]) -> int:
    """A child run for each ended trial not logged yet; returns how many were added."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    experiment = configure_mlflow(tracking)
    logged = {r.data.tags.get(TRIAL_TAG) for r in client.search_runs(
        [experiment], f"tags.`{STUDY_TAG}` = '{study}'", max_results=5000)}
    added = 0
    for row in rows:
        if str(row["number"]) in logged or row["state"] in ("running", "waiting"):
            continue
        tags = {"mlflow.parentRunId": parent, STUDY_TAG: study, TRIAL_TAG: str(row["number"]),
                "sweep.state": row["state"], "sweep.stages": str(row["stages"])[:4000],
                "sweep.reused": ", ".join(s for s, status in row["stages"].items() if status != "ran") or "none"}
        if row["note"]:
            tags["sweep.note"] = row["note"][:4000]
        run = client.create_run(experiment, run_name=f"trial {row['number']}", tags=tags).info.run_id
        params = [Param(key, str(value)[:500]) for key, value in row["values"].items()]
        metrics = [Metric("validation_score", row["value"], 0, 0)] if row["value"] is not None else []
        client.log_batch(run, metrics=metrics, params=params)
        client.set_terminated(run, STATUS.get(row["state"].upper(), "FINISHED"))
        added += 1
    return added


def log_plots(tracking: TrackingParams, parent: str, study) -> list[str]:
    """The parallel-coordinates plot and the parameter importances on the parent run; what was drawn or why not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow import MlflowClient
    from optuna.visualization.matplotlib import plot_parallel_coordinate, plot_param_importances

    client = MlflowClient(tracking_uri=tracking.resolved_uri())
    notes = []
    with tempfile.TemporaryDirectory() as folder:
        for name, draw in (("parallel_coordinates.png", plot_parallel_coordinate),
                           ("param_importances.png", plot_param_importances)):
            try:
                axes = draw(study)
                axes.figure.savefig(Path(folder) / name, dpi=100, bbox_inches="tight")
                plt.close(axes.figure)
                client.log_artifact(parent, str(Path(folder) / name), "sweep")
                notes.append(f"{name} logged")
            except Exception as exc:   # too few finished trials, or one searched param: no figure, said why
                notes.append(f"{name} not drawn ({type(exc).__name__}: {str(exc)[:120]})")
    return notes
