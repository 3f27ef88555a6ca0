"""The `monitor` deployment's flow: Evidently on the request log -> drift event -> retrain (flows/retrain.py). With a
Prefect server (PREFECT_API_URL) the monitor emits `torchship.drift.detected` and the `retrain` deployment's trigger
(prefect.yaml) starts the retrain; in the embedded default it calls the same retrain flow directly, behind the
same guards. It also starts the canary of a challenger a person approved since (flows/canary.py)."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.canary import canary_flow, pull_prepared
from flows.environment import server_configured
from flows.retrain import RETRAINED, TRIGGER_KEY, decisions_at, record, retrain
from tasks import monitor as monitor_step
from tasks import retrain as retrain_step
from tasks.config import load_params
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.monitoring import guards
from tasks.monitoring.segments import log_source
from tasks.monitoring.window import read_window
from tasks.registry.approvals import approved_challenger_without_canary, review_quietly
from tasks.registry.read import registry_client, versions_tagged

DRIFT_EVENT = "torchship.drift.detected"


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
    ingested = retrain_step.labelled_times(params)   # e.g. an image model learns from ingested images, not the log
    outcome, reasons = guards.decide_retrain(report.gate, window, history, params.retrain, time.time(), retrained,
                                             report.prediction_only, ingested)
    until = {"labels_until": max(ingested, default=0.0)} if ingested is not None else {}
    return guards.make_decision(outcome, reasons, report.gate, window, report=report.report, summary=report.summary,
                                labels_since=guards.high_water(history), **until)


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
