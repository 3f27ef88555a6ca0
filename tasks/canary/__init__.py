"""canary: the progressive canary of the `challenger` against the `champion` on a real service (shadow phase,
then traffic steps, each judged; promote or roll back: tasks/canary/), or, with no challenger, a smoke test of
the champion on the same embedded service and replayed holdout rows. (Prefect-only: it acts on live registry
state.)"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from tasks.canary.analysis import judge_smoke
from tasks.canary.client import ReplayTraffic, ServiceClient, embedded_service
from tasks.canary.progressive import Record, promote_or_roll_back, run_steps, smoke_step, tag_step
from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.schema_spec import Schema, load_schema
from tasks.core.verdicts import CanaryOutcome, CanaryReport
from tasks.modalities import input_signature, load_holdout, modality_of
from tasks.modalities.interface import Holdout
from tasks.registry.notifications import Notice, notify_once
from tasks.registry.read import CHALLENGER, CHAMPION, alias_version, aliases, registry_client

log = logging.getLogger("torchship.canary")
SMOKE_ONLY = "smoke test only (no challenger)"


@contextlib.contextmanager
def replayed_service(name: str, holdout: Holdout, schema: Schema, requests: int, startup_timeout_s: float
                     ) -> Iterator[tuple[ServiceClient, ReplayTraffic]]:
    """The embedded default: a service started for the canary and up to `requests` distinct holdout items replayed
    to it as a client sends them (their labels posted as feedback)."""
    with embedded_service(name, startup_timeout_s) as service:
        bodies, positions = modality_of(schema).request_bodies(holdout, schema, min(requests, len(holdout.labels)))
        truth = [schema.classes[i] for i in holdout.labels[positions]]
        traffic = ReplayTraffic(service.url, bodies, truth)
        try:
            yield service, traffic
        finally:
            traffic.close()


def signature_difference(client, name: str, champion: str, challenger: str) -> str | None:
    """Why the two versions are not comparable (input signature or classes), or None when they are."""
    from tasks.registry.read import open_version

    ours, theirs = (open_version(client, name, version, 1)[1] for version in (challenger, champion))
    if input_signature(ours) != input_signature(theirs):
        added = sorted(set(input_signature(ours)) - set(input_signature(theirs)))
        gone = sorted(set(input_signature(theirs)) - set(input_signature(ours)))
        return (f"v{challenger}'s input signature differs from champion v{champion}'s (only the challenger: "
                f"{added[:5]}; only the champion: {gone[:5]})")
    if ours.classes != theirs.classes:
        return f"v{challenger}'s classes {ours.classes} differ from champion v{champion}'s {theirs.classes}"
    return None


def run_canary(params: Params, holdout: Holdout | None, schema: Schema,
               service: ServiceClient | None = None,
               record: Record | None = None, smoke: bool = True) -> CanaryReport:
    """Smoke-test the champion alone (unless `smoke` is off: a re-run that changed nothing), or run the progressive
    canary of the challenger against it and act on the registry. `service`: a running service whose live traffic is
    observed; None (the embedded default): a service started for the canary, fed with replayed holdout rows.
    `record` is called with each step's verdict. Requests carry the model's features only (a contract's key column
    is data, not a feature)."""
    started = time.perf_counter()
    client = registry_client(params.tracking)
    name = params.data.registered_model_name()
    challenger, champion = alias_version(client, name, CHALLENGER), alias_version(client, name, CHAMPION)

    def report(gate: GateResult, outcome: CanaryOutcome, action: str, **figures) -> CanaryReport:
        return CanaryReport(gate=gate, outcome=outcome, action=action, aliases=aliases(client, name),
                            seconds=time.perf_counter() - started, **figures)

    if champion is None:   # e.g. a first model that bless refused: nothing to serve
        return report(GateResult(gate="canary", status="pass", reasons=["nothing to serve or compare"]),
                      CanaryOutcome.NOT_CANARIED, "skipped: no champion")
    timeout_s, requests = params.canary.startup_timeout_s, params.canary.requests
    if challenger is None:
        if service is not None:
            return report(GateResult(gate="canary", status="pass", reasons=["no challenger to canary"]),
                          CanaryOutcome.NOT_CANARIED, "skipped: no challenger")
        if not smoke:
            return report(GateResult(gate="canary", status="pass", reasons=[
                f"champion v{champion.version} unchanged (smoke-tested when it became champion)"]),
                CanaryOutcome.NOT_CANARIED, "skipped: no challenger")
        with replayed_service(name, holdout, schema, requests, timeout_s) as (service, traffic):
            smoke = smoke_step(service, str(champion.version), traffic, min(traffic.rows, params.canary.smoke_requests))
        return report(judge_smoke(smoke, params.canary), CanaryOutcome.SMOKE_TESTED, SMOKE_ONLY, smoke=smoke)
    versions = str(champion.version), str(challenger.version)
    if (difference := signature_difference(client, name, *versions)) is not None:
        return report(GateResult(gate="canary", status="fail", reasons=[difference]), CanaryOutcome.NOT_COMPARABLE,
                      f"not run: {difference}; nothing moved (a new table needs `torchship rebaseline`)")

    def steps(service: ServiceClient, traffic: ReplayTraffic | None) -> CanaryReport:
        service.wait_serving(*versions, timeout_s)

        def on_step(verdict) -> None:
            tag_step(client, name, versions[1], verdict)
            if record is not None:
                record(verdict)

        verdicts = run_steps(service, *versions, params.canary, traffic, on_step)
        return report(*promote_or_roll_back(client, name, versions[1], verdicts, params.canary), steps=verdicts)

    if service is not None:
        return steps(service, None)
    with replayed_service(name, holdout, schema, requests, timeout_s) as (service, traffic):
        return steps(service, traffic)


def run(params: Params, parent_run: str | None = None, service: ServiceClient | None = None,
        record: Record | None = None, smoke: bool = True) -> CanaryReport:
    """The step: the canary (see run_canary), logged as a nested MLflow run."""
    import mlflow

    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    with stage_run(params.tracking, "canary", parent_run):
        report = run_canary(params, load_holdout(schema), schema, service, record, smoke)
        mlflow.log_dict(report.model_dump(), "canary.json")
        mlflow.set_tag("gate.status", report.gate.status)
    log.info("canary: %s -> %s", report.gate.summary(), report.action)
    if report.outcome is CanaryOutcome.ROLLED_BACK:
        name = params.data.registered_model_name()
        notify_once(registry_client(params.tracking), rollback_notice(name, report), params.notify)
    return report


def rollback_notice(name: str, report: CanaryReport) -> Notice:
    """The webhook's notice of a rollback: once per version rolled back."""
    last = report.steps[-1]
    return Notice(event="canary-rolled-back", key=f"v{last.challenger.version}", model=name,
                  text=f"{name}: the canary rolled back v{last.challenger.version} at step {last.phase}: "
                       f"{'; '.join(last.reasons)}; champion unchanged")
