"""The `pipeline` deployment's flow, step by step as in the diagram: the DVC stages in dvc.yaml's order (DVC skips
what is unchanged), then bless -> register -> canary against the live registry. Each step lives in tasks/<step>."""
from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.canary import record_decision, record_step
from tasks import bless, canary, register, validate
from tasks.config import load_params
from tasks.core import paths, tracking
from tasks.core.artifacts import read_json
from tasks.core.params_spec import Params, TrackingParams
from tasks.core.verdicts import BlessOutcome
from tasks.modalities import sources
from tasks.monitoring import batch_index
from tasks.registry.approvals import review_approvals
from tasks.stages import repro
from tasks.stages.lineage import git_state
from tasks.stages.stage_list import pipeline_stages
from tasks.stages.summary import PipelineSummary, summarize
from tasks.workspace.lock import workspace_lock


@task(name="dvc-stage", task_run_name="{stage}")
def dvc_stage(stage: str, parent_run: str, tracked: TrackingParams) -> repro.StageOutcome:
    """Let DVC decide skip-or-run from hashes; the stage's MLflow run, which it records, is logged here under the
    pipeline's (tasks/core/tracking.py says why)."""
    def log_stage_run(folder: Path) -> None:
        try:
            tracking.replay_stage_log(tracked, folder, parent_run)
        except Exception as exc:   # the tracking server away: register, later, says so and what to do
            get_run_logger().warning("%s: its MLflow run was not logged (%s); its reports are in data/%s/", stage,
                                     str(exc).splitlines()[0][:200], stage)

    try:
        outcome = repro.reproduce(stage, env={tracking.PARENT_RUN_ENV: parent_run}, log_stage_run=log_stage_run)
    finally:
        if stage == "validate" and paths.VALIDATE_REPORT.exists():  # the gate's table, pass or fail
            create_markdown_artifact(key="data-contract-gate", markdown=validate.report_markdown(
                read_json(paths.VALIDATE_REPORT)), description="Great Expectations gate on the training data")
    get_run_logger().info("%s %s (%.1fs): %s", stage, outcome.status, outcome.seconds, outcome.reason)
    return outcome


bless_step = task(name="bless")(bless.run)
register_step = task(name="register")(register.run)
canary_step = task(name="canary")(canary.run)
approvals_review = task(name="approvals")(review_approvals)


@task(name="pull-batches", retries=2, retry_delay_seconds=10)   # I/O on the tracking server and the DVC remote
def pull_batches(params: Params) -> str:
    """The accepted batches the shared index names (a retrain on another worker may have added one)."""
    outcome = batch_index.pull_shared_batches(params.tracking, params.data.registered_model_name())
    get_run_logger().info(outcome)
    return outcome


@task(name="check-source")
def check_source(params: Params) -> None:
    """Refuse a missing file or target column now, not after the stages start; then refresh data/source.json
    (DVC hashes it) so a changed file or a new accepted batch re-runs prepare, and record the source stage."""
    sources.check_source(params)
    sources.write_source_fingerprint(params)
    repro.record_stage("source")   # as `dvc repro` would have left it: plain `dvc status` stays clean


@task(name="publish-summary")
def publish_summary(params: Params, parent_run: str, summary: PipelineSummary) -> None:
    tracking.log_run_text(params.tracking, parent_run, summary.markdown(), "summary.md")
    create_markdown_artifact(key="pipeline-summary", markdown=summary.markdown(), description="torchship run summary")


@flow(name="torchship-pipeline", log_prints=True)
def pipeline(params_file: str = "params.yaml", trigger: dict[str, str] | None = None) -> PipelineSummary:
    """dvc.yaml's stages in its order (the source fingerprint refreshed first), then the Prefect-only steps, one call
    each in PREFECT_STEPS' order (tests/unit/test_paths.py checks): bless -> register -> approvals
    (promotion.approval: decisions made since, timeouts) -> canary.
    `trigger`: tags naming why this run happened (a retrain's window), put on the run and a new version."""
    params = load_params(params_file)
    # the workspace before anything is written (data/batches/, data/source.json, dvc.lock): re-entrant, so a
    # `torchship run` or a retrain that holds it already goes straight on
    with workspace_lock("the pipeline run", params.retrain.workspace_wait_s):
        pull_batches(params)
        check_source(params)
        run_tags = {**git_state(), "data_source": params.data.source, **(trigger or {})}
        with tracking.pipeline_run(params.tracking, run_tags) as parent_run, repro.last_good_outputs():
            # dvc.yaml's stages, in its order
            stages = [dvc_stage(stage, parent_run, params.tracking) for stage in pipeline_stages()]
            blessing = bless_step(params, parent_run)
            registration = register_step(params, blessing, parent_run, trigger)
            approvals_review(params, "the pipeline")   # decided in the MLflow UI, or timed out: the canary goes next
            canary_report = canary_step(params, parent_run, None, record_step,
                                        smoke=blessing.outcome is not BlessOutcome.UNCHANGED)
            record_decision(canary_report, params.data.registered_model_name())
            summary = summarize(stages, blessing, registration, canary_report, parent_run)
            publish_summary(params, parent_run, summary)
    return summary
