"""The pipeline flow: DVC stages, then bless -> register -> canary against live registry state."""
from __future__ import annotations

import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from tasks import bless, canary, register, reproduce, tracking
from tasks.config import Params, load_params
from tasks.holdout import load_holdout
from tasks.lineage import git_state
from tasks.summary import REPORTS, PipelineSummary, StepRow


@task(name="dvc-stage", task_run_name="{stage}")
def run_dvc_stage(stage: str, parent_run: str) -> reproduce.StageOutcome:
    """Let DVC decide skip-or-run from hashes; the stage nests its MLflow run under the pipeline's."""
    outcome = reproduce.reproduce(stage, env={tracking.PARENT_RUN_ENV: parent_run})
    get_run_logger().info("%s %s (%.1fs): %s", stage, outcome.status, outcome.seconds, outcome.reason)
    return outcome


@task(name="open-tracking")
def open_tracking(params: Params) -> str:
    return tracking.open_pipeline_run(params.tracking, {**git_state(), "data_source": params.data.source})


@task(name="bless")
def bless_step(params: Params, parent_run: str) -> bless.Blessing:
    with tracking.stage_run(params.tracking, "bless", parent_run) as run:
        import mlflow

        blessing = bless.bless_candidate(params)
        mlflow.log_dict(blessing.model_dump(), "bless.json")
        mlflow.set_tag("gate.status", blessing.gate.status)
    return blessing


@task(name="register")
def register_step(params: Params, blessing: bless.Blessing, parent_run: str) -> register.Registration:
    with tracking.stage_run(params.tracking, "register", parent_run):
        return register.register_candidate(params, blessing, parent_run)


@task(name="canary")
def canary_step(params: Params, parent_run: str) -> canary.CanaryReport:
    from tasks.contract import load_schema
    from tasks import layout

    schema = load_schema(layout.SCHEMA)
    with tracking.stage_run(params.tracking, "canary", parent_run):
        import mlflow

        report = canary.run_canary(params, load_holdout(schema).rows, schema.target)
        mlflow.log_dict(report.model_dump(), "canary.json")
        mlflow.set_tag("gate.status", report.gate.status)
    get_run_logger().info("canary: %s -> %s", report.gate.summary(), report.action)
    return report


@task(name="close-tracking")
def close_tracking(params: Params, parent_run: str, summary: PipelineSummary) -> None:
    tracking.close_pipeline_run(params.tracking, parent_run, ok=True, summary_markdown=summary.markdown())
    create_markdown_artifact(key="pipeline-summary", markdown=summary.markdown(), description="torchship run summary")


@flow(name="torchship-pipeline", log_prints=True)
def pipeline(params_file: str = "params.yaml") -> PipelineSummary:
    """prepare -> validate -> train -> export -> compress -> profile -> bless -> register -> canary."""
    params = load_params(params_file)
    parent_run = open_tracking(params)
    steps = []
    for stage in reproduce.DVC_STAGES:
        outcome = run_dvc_stage(stage, parent_run)
        steps.append(StepRow(step=stage, status=outcome.status, seconds=outcome.seconds, headline=outcome.headline))
    started = time.perf_counter()
    blessing = bless_step(params, parent_run)
    steps.append(StepRow(step="bless", status=blessing.gate.status, seconds=time.perf_counter() - started,
                         headline="; ".join(blessing.gate.reasons)))
    started = time.perf_counter()
    registration = register_step(params, blessing, parent_run)
    steps.append(StepRow(step="register", status="new version" if registration.created else "reused",
                         seconds=time.perf_counter() - started, headline=registration.action))
    started = time.perf_counter()
    report = canary_step(params, parent_run)
    steps.append(StepRow(step="canary", status=report.gate.status, seconds=time.perf_counter() - started,
                         headline=f"{report.action}: {'; '.join(report.gate.reasons)}"))
    summary = PipelineSummary(model_name=registration.model_name, steps=steps, version=registration.version,
                              aliases=report.aliases, verdict=report.action,
                              pipeline_run=parent_run, reports=REPORTS)
    close_tracking(params, parent_run, summary)
    return summary
