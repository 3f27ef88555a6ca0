"""The closed loop, as flows: monitor (Evidently on the request log) -> drift event -> retrain (the labelled
window joins the training data, the pipeline re-runs, the normal gates and the canary decide). With a Prefect
server (PREFECT_API_URL) the monitor emits `torchship.drift.detected` and the `retrain` deployment's trigger
(prefect.yaml) starts the retrain; in the embedded default it calls the same retrain flow directly, behind the
same guards. (The canary's own flow is in flows/canary.py.)"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.canary import canary_flow, pull_prepared
from flows.environment import server_configured
from flows.pipeline import pipeline
from flows.slot import WorkspaceBusy, workspace_slot
from tasks import monitor as monitor_step
from tasks import retrain as retrain_step
from tasks.config import Params, load_params
from tasks.core import paths
from tasks.core.bucket import BucketError
from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.registry import registry_client, versions_tagged
from tasks.monitoring import guards
from tasks.monitoring.notices import announce_decision
from tasks.monitoring.segments import log_source
from tasks.monitoring.window import read_window
from tasks.ops.approvals import approved_challenger_without_canary, review_quietly

DRIFT_EVENT = "torchship.drift.detected"
TRIGGER_KEY, RETRAINED = "trigger", "retrain"   # the tag a retrain's version carries


def drift_markdown(report: monitor_step.MonitorReport) -> str:
    rows = "\n".join(f"| {name} | {c.method} | {c.score:.3f} | {c.threshold:g} | {'**yes**' if c.drifted else 'no'} |"
                     for name, c in report.findings.features.items())
    prediction = report.findings.prediction
    quality = report.findings.quality
    estimate = report.findings.estimate
    return (f"# Drift: {report.gate.status}\n\n{'; '.join(report.gate.reasons)}\n\n"
            f"Window: {report.window['rows']} rows ({report.window['labelled']} labelled), served by "
            f"{report.window['versions']}; Evidently saw {report.findings.sampled} rows per side.\n\n"
            f"| feature | test | score | threshold | drifted |\n|---|---|---|---|---|\n{rows}\n\n"
            + (f"Prediction drift: {prediction.score:.3f} ({prediction.method}).\n\n" if prediction else "")
            + (f"Accuracy on feedback: {quality.accuracy:.3f} vs holdout {quality.reference_accuracy:.3f}.\n\n"
               if quality else "")
            + (f"Estimated accuracy (label-free, from the served probabilities): {estimate.accuracy:.3f} ± "
               f"{estimate.standard_error:.3f} on {estimate.rows} rows vs holdout {estimate.reference_accuracy:.3f} "
               f"(the estimate said {estimate.reference_estimate:.3f} there).\n\n" if estimate else "")
            + f"Evidently report: `{Path(report.report).resolve()}` (also in MLflow run `{report.mlflow_run}`, "
              f"folder `monitor/`).\n")


@task(name="drift-report")
def measure(params: Params):
    window = read_window(log_source(params.serve), params.monitor)
    report = monitor_step.run(params, window)
    create_markdown_artifact(key="drift-report", markdown=drift_markdown(report),
                             description="Evidently drift of the served window vs the training split")
    return window, report


@task(name="trigger-decision")
def trigger_decision(params: Params, window, report: monitor_step.MonitorReport) -> guards.Decision:
    retrained = versions_tagged(registry_client(params.tracking), report.model_name, TRIGGER_KEY, RETRAINED)
    history = guards.read_decisions(decisions_at(params))
    ingested = retrain_step.ingested_image_times()   # an image model learns from ingested images, not the log
    outcome, reasons = guards.decide_retrain(report.gate, window, history, params.retrain, time.time(), retrained,
                                             report.prediction_only, ingested)
    until = {"labels_until": max(ingested, default=0.0)} if ingested is not None else {}
    return guards.make_decision(outcome, reasons, report.gate, window, report=report.report, summary=report.summary,
                                labels_since=guards.high_water(history), **until)


def decisions_at(params: Params) -> Path | str:
    """This tree's decisions file, or the bucket's folder every worker shares (guards.decision_log)."""
    return guards.decision_log(params.serve, paths.DECISIONS)


def record(params: Params, decision: guards.Decision) -> guards.Decision:
    """Record a trigger decision and send its notice (a retrain fired, retrains began to be suppressed), once."""
    guards.record(decisions_at(params), decision)
    announce_decision(params, decision, decisions_at(params))
    return decision


@task(name="approvals")
def approved_challenger(params: Params) -> str | None:
    """Act on approval decisions made in the MLflow UI and on timeouts; the approved challenger no canary judged
    yet, if any."""
    review_quietly(params, "the monitor")
    return approved_challenger_without_canary(params)


def canary_approved(params_file: str) -> None:
    """The approved challenger's canary (it takes the workspace slot: busy, the next monitor run tries again)."""
    try:
        canary_flow(params_file)
    except TorchshipError as exc:
        get_run_logger().warning("the approved challenger's canary did not run: %s", exc)


@flow(name="torchship-monitor", log_prints=True)
def monitor(params_file: str = "params.yaml", act: bool = True) -> guards.Decision:
    """Start the canary of a challenger a person approved since (promotion.approval), then judge the newest window
    of served traffic; on material drift, start a retrain (event or direct call) unless a guard holds it back.
    Every decision is recorded in data/monitor/decisions.jsonl."""
    params = load_params(params_file)
    logger = get_run_logger()
    if approved_challenger(params) is not None and act:
        canary_approved(params_file)
    pull_prepared(params)
    window, report = measure(params)
    decision = trigger_decision(params, window, report)
    logger.info("drift gate %s; trigger %s: %s", report.gate.status, decision.outcome, "; ".join(decision.reasons))
    if decision.outcome != "fired" or not act:
        return record(params, decision)
    if server_configured():
        from prefect.events import emit_event

        emitted = emit_event(event=DRIFT_EVENT, resource={"prefect.resource.id": f"torchship.model.{report.model_name}",
                                                          "prefect.resource.name": report.model_name},
                             payload={"labels_since": decision.labels_since, "labels_until": decision.labels_until,
                                      "window": decision.window, "report": report.report, "summary": report.summary,
                                      "reason": "; ".join(decision.reasons), "params_file": params_file})
        decision.run = f"event {emitted.id if emitted else '(not sent)'}: the retrain deployment's trigger starts it"
        return record(params, decision)
    decision.run = "direct: embedded default (no Prefect server)"
    record(params, decision)
    retrain(params_file, decision.labels_since, decision.labels_until, "; ".join(decision.reasons), report.report)
    return decision


@flow(name="torchship-retrain", log_prints=True)
def retrain(params_file: str = "params.yaml", labels_since: float = 0.0, labels_until: float = 0.0,
            reason: str = "", report: str = "") -> dict:
    """Take the labelled window (labels_since, labels_until], judge it at the batch door, snapshot it with DVC
    and re-run the pipeline under the normal gates. Never promotes by itself: the canary decides."""
    params = load_params(params_file)
    logger = get_run_logger()

    def dropped(gate: GateResult, why: str) -> dict:
        logger.warning("retrain dropped: %s", why)
        record(params, guards.Decision(ts=time.time(), outcome="suppressed", gate=gate, reasons=[why], window={},
                                       report=report or None, labels_since=labels_since))
        return {"batch": None, "pipeline": None, "dropped": why}

    try:
        with workspace_slot("the retrain", params.retrain.workspace_wait_s):
            # A retrain that waited (the deployment's own limit queues it) never learns the same labels twice.
            labels_since = max(labels_since, guards.high_water(guards.read_decisions(decisions_at(params))))
            pull_prepared(params)
            try:
                window = read_window(log_source(params.serve), params.monitor, since=labels_since)
            except BucketError:   # the store refused or is down: an error, not an empty window
                raise
            except TorchshipError as exc:
                return dropped(GateResult(gate="retrain window", status="fail", reasons=[str(exc)]),
                               f"loop protection: no served rows newer than the last retrain's labels ({exc})")
            batch = retrain_step.take_labelled(params, window, labels_since, labels_until or window.end)
            logger.info("retrain batch: %s", batch.gate.summary())
            if batch.batch is None:
                record(params, guards.make_decision(
                    "suppressed", [f"batch door refused the window: {batch.gate.summary()}"], batch.gate, window,
                    report=report or None, labels_since=labels_since))
                return {"batch": batch.model_dump(), "pipeline": None}
            summary = pipeline(params_file, trigger={TRIGGER_KEY: RETRAINED, "retrain_batch": Path(batch.batch).name,
                                                     "retrain_reason": reason[:500]})
            guards.record(decisions_at(params), guards.make_decision(
                "retrained", [f"{batch.accepted_rows} labelled rows joined the training data "
                              f"({Path(batch.batch).name}); v{summary.version}: {summary.verdict}"],
                batch.gate, window, report=report or None,
                labels_since=labels_since, labels_until=batch.labels_until))
            return {"batch": batch.model_dump(), "pipeline": summary.model_dump()}
    except WorkspaceBusy as exc:
        return dropped(GateResult(gate="workspace", status="fail", reasons=[str(exc)]), f"workspace busy: {exc}")
