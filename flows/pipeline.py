"""The pipeline flow: DVC stages, then bless -> register -> canary against live registry state."""
from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from tasks import bless, canary, layout, register, reproduce, tracking, validate
from tasks.artifacts import read_json
from tasks.config import Params, load_params
from tasks.holdout import load_holdout
from tasks.lineage import git_state
from tasks.summary import PipelineSummary, summarize


@task(name="dvc-stage", task_run_name="{stage}")
def run_dvc_stage(stage: str, parent_run: str) -> reproduce.StageOutcome:
    """Let DVC decide skip-or-run from hashes; the stage nests its MLflow run under the pipeline's."""
    try:
        outcome = reproduce.reproduce(stage, env={tracking.PARENT_RUN_ENV: parent_run})
    finally:
        if stage == "validate" and layout.VALIDATE_REPORT.exists():  # the gate's table, pass or fail
            create_markdown_artifact(key="data-contract-gate", markdown=validate.report_markdown(
                read_json(layout.VALIDATE_REPORT)), description="Great Expectations gate on the training data")
    get_run_logger().info("%s %s (%.1fs): %s", stage, outcome.status, outcome.seconds, outcome.reason)
    return outcome


@task(name="fingerprint-source")
def fingerprint_source(params: Params) -> None:
    """DVC hashes data/source.json: refresh it so a changed file or a new accepted batch re-runs prepare."""
    from tasks.prepare import write_source_fingerprint

    write_source_fingerprint(params.data)


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

    schema = load_schema(layout.SCHEMA)
    with tracking.stage_run(params.tracking, "canary", parent_run):
        import mlflow

        report = canary.run_canary(params, load_holdout(schema).rows, schema)
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
    fingerprint_source(params)
    parent_run = open_tracking(params)
    last_good = reproduce.snapshot_state()
    try:
        outcomes = [run_dvc_stage(stage, parent_run) for stage in reproduce.DVC_STAGES]
        blessing = bless_step(params, parent_run)
        registration = register_step(params, blessing, parent_run)
        report = canary_step(params, parent_run)
    except Exception:
        reproduce.restore_workspace(last_good)
        tracking.close_pipeline_run(params.tracking, parent_run, ok=False)
        raise
    summary = summarize(registration.model_name, outcomes, blessing, registration, report, parent_run)
    close_tracking(params, parent_run, summary)
    return summary
