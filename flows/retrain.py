"""The `retrain` deployment's flow: the labelled window of served traffic (judged at the batch gate, snapshotted with
DVC) joins the training data and the pipeline re-runs under the normal gates; the canary decides afterwards. The
monitor flow starts it (an event on a Prefect server, a direct call in the embedded default), and both record
their trigger decisions here."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger

from flows.canary import pull_prepared
from flows.pipeline import pipeline
from tasks import retrain as retrain_step
from tasks.config import load_params
from tasks.core import paths
from tasks.core.bucket import BucketError
from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.monitoring import guards
from tasks.monitoring.segments import log_source
from tasks.monitoring.trigger_notifications import announce_decision
from tasks.monitoring.window import read_window
from tasks.workspace.lock import WorkspaceBusy, workspace_lock

TRIGGER_KEY, RETRAINED = "trigger", "retrain"   # the tag a retrain's version carries


def decisions_at(params: Params) -> Path | str:
    """This tree's decisions file, or the bucket's folder every worker shares (guards.decision_log)."""
    return guards.decision_log(params.serve, paths.DECISIONS)


def record(params: Params, decision: guards.Decision) -> guards.Decision:
    """Record a trigger decision and send its notice (a retrain fired, retrains began to be suppressed), once."""
    guards.record(decisions_at(params), decision)
    announce_decision(params, decision, decisions_at(params))
    return decision


@flow(name="torchship-retrain", log_prints=True)
def retrain(params_file: str = "params.yaml", labels_since: float = 0.0, labels_until: float = 0.0,
            reason: str = "", report: str = "") -> dict:
    """Take the labelled window (labels_since, labels_until], judge it at the batch gate, snapshot it with DVC
    and re-run the pipeline under the normal gates. Never promotes by itself: the canary decides."""
    params = load_params(params_file)
    logger = get_run_logger()

    def dropped(gate: GateResult, why: str) -> dict:
        logger.warning("retrain dropped: %s", why)
        record(params, guards.Decision(ts=time.time(), outcome="suppressed", gate=gate, reasons=[why], window={},
                                       report=report or None, labels_since=labels_since))
        return {"batch": None, "pipeline": None, "dropped": why}

    try:
        with workspace_lock("the retrain", params.retrain.workspace_wait_s):
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
                    "suppressed", [f"batch gate refused the window: {batch.gate.summary()}"], batch.gate, window,
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
