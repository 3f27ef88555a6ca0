"""monitor: judge a window of served traffic against the training split with Evidently (per-feature drift,
prediction drift, accuracy on feedback labels) and a label-free estimate of accuracy, and return the drift gate.
Prefect-only: it reads live state (the request log, the registry). Evidence: an Evidently HTML report and a JSON
summary under data/monitor/, both also logged to MLflow."""
from __future__ import annotations

import logging
import time

import pandas as pd
from pydantic import BaseModel

from tasks.core import paths
from tasks.core.artifacts import write_json_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.quarantine import unique_stamp
from tasks.core.schema_spec import Schema
from tasks.modalities import load_holdout, modality_of
from tasks.modalities.scoring import served_classes
from tasks.monitoring.drift import DriftFindings, judge, measure_drift, save_html
from tasks.monitoring.estimate import Holdout, expected_accuracy, fit_reliability
from tasks.monitoring.segments import log_source
from tasks.monitoring.window import Window, read_window
from tasks.registry.history import champion_concern, notice_outside_moves
from tasks.registry.notifications import champion_notice, notify_once
from tasks.registry.read import CHAMPION, alias_version, open_version, registry_client

log = logging.getLogger("torchship.monitor")


class MonitorReport(BaseModel):
    gate: GateResult
    findings: DriftFindings
    window: dict
    model_name: str
    version: str                   # the version that served most of the window (its answers are the reference's)
    report: str                    # Evidently HTML
    summary: str                   # JSON summary
    prediction_only: bool          # the gate failed on the prediction column alone
    mlflow_run: str | None = None
    seconds: float = 0.0


def reference_frame(schema: Schema, session, rows: int, seed: int) -> pd.DataFrame:
    """Reference items in the request log's columns (a table's features, an image's statistics and embedding), with
    the serving version's answers on them: what the window is compared with."""
    return modality_of(schema).reference_frame(schema, session, rows, seed)


def holdout_scores(schema: Schema, session) -> Holdout:
    """The serving version on the holdout, scored now: its accuracy (the figure feedback accuracy and the estimate
    are held to), its probabilities' own estimate there, and the reliability curves the window's estimate uses."""
    holdout = load_holdout(schema)
    probabilities, decided = served_classes(session, schema, holdout.feed)
    labels = holdout.labels
    return Holdout(accuracy=float((decided == labels).mean()), estimate=expected_accuracy(probabilities, decided)[0],
                   reliability=fit_reliability(probabilities, decided, labels))


def monitor_window(params: Params, window: Window, client=None) -> MonitorReport:
    """The core on a given window: score the reference with the serving version, measure, judge, save."""
    started = time.perf_counter()
    client = client or registry_client(params.tracking)
    name = params.data.registered_model_name()
    version = max(window.versions().items(), key=lambda item: item[1])[0]
    session, schema = open_version(client, name, version, params.runtime.threads)
    reference = reference_frame(schema, session, params.monitor.sample_rows, params.monitor.seed)
    findings, samples = measure_drift(reference, window.rows, schema, params.monitor, holdout_scores(schema, session))
    stamp = unique_stamp()
    report = save_html(samples, schema, paths.MONITOR_REPORTS / f"{stamp}.html")
    summary = paths.MONITOR_REPORTS / f"{stamp}.json"
    gate = judge(findings, params.monitor, evidence=str(report))
    # an estimated drop is the serving version held to its own holdout: no retrain answers differently there
    inputs_moved = findings.drifted_share >= params.monitor.max_drifted_share or (
        findings.quality is not None and findings.quality.drop > params.monitor.max_quality_drop) or (
        findings.estimate is not None and findings.estimate.drop > params.monitor.max_estimated_drop)
    result = MonitorReport(gate=gate, findings=findings, window=window.describe(), model_name=name, version=version,
                           report=str(report), summary=str(summary),
                           prediction_only=gate.status == "fail" and not inputs_moved)
    result.seconds = time.perf_counter() - started
    write_json_atomic(summary, result.model_dump())
    write_json_atomic(paths.MONITOR_LATEST, result.model_dump())
    return result


def notice_moves(params: Params) -> None:
    """Record alias moves made outside torchship since the history's last entry (when no service watched the
    registry), and notify an unblessed or rejected champion; the monitor's own verdict never waits on it or fails
    by it."""
    client, name = registry_client(params.tracking), params.data.registered_model_name()
    for entry in notice_outside_moves(client, name, "the monitor"):
        log.warning("monitor: %s %s moved outside torchship: recorded in the alias history", entry.alias,
                    entry.moved())
    try:
        champion = alias_version(client, name, CHAMPION)
    except Exception as exc:   # never the monitor's failure
        log.warning("monitor: the champion could not be read: %s", exc)
        return
    if champion is not None and (concern := champion_concern(champion.tags)):
        notify_once(client, champion_notice(name, str(champion.version), concern), params.notify)


def run(params: Params, window: Window | None = None) -> MonitorReport:
    """The step: read the window (unless given), judge it, log the evidence to an MLflow run `monitor`."""
    import mlflow

    from tasks.core.tracking import stage_run

    notice_moves(params)
    window = window or read_window(log_source(params.serve), params.monitor)
    with stage_run(params.tracking, "monitor") as run:
        result = monitor_window(params, window)
        mlflow.log_artifact(result.report, "monitor")
        mlflow.log_artifact(result.summary, "monitor")
        mlflow.log_metrics({"drifted_share": result.findings.drifted_share, "window_rows": len(window.rows),
                            "labelled_rows": len(window.labelled)})
        if result.findings.quality:
            mlflow.log_metric("feedback_accuracy", result.findings.quality.accuracy)
        if result.findings.estimate:
            mlflow.log_metrics({"estimated_accuracy": result.findings.estimate.accuracy,
                                "estimated_accuracy_drop": result.findings.estimate.drop})
        mlflow.set_tags({"gate.status": result.gate.status, "model_version": result.version})
        result.mlflow_run = run.info.run_id
    log.info("monitor: %s", result.gate.summary())
    return result
