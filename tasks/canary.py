"""canary: the progressive canary of the `challenger` against the `champion` on a real service (shadow phase,
then traffic steps, each judged; promote or roll back: tasks/canarying/), or, with no challenger, a smoke test of
the champion on replayed holdout rows. (Prefect-only: it acts on live registry state.)"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from tasks.config import CanaryParams, Params
from tasks.contract import Schema, load_schema
from tasks.core import paths
from tasks.core.gate import GateResult
from tasks.core.holdout import load_holdout
from tasks.core.procs import running_service
from tasks.core.registry import CHALLENGER, CHAMPION, alias_version, aliases, registry_client
from tasks.canarying.link import ReplayTraffic, ServiceLink, embedded_service
from tasks.canarying.progressive import Record, decide, run_steps, tag_step
from tasks.core.verdicts import CanaryReport, VariantTraffic

log = logging.getLogger("torchship.canary")
SMOKE_ONLY = "smoke test only (no challenger)"


def smoke_service(model_name: str, rules: CanaryParams):
    """The service for the champion's smoke test: all traffic to the champion, no request log (replayed rows are
    not production traffic)."""
    return running_service(model_name, ["--challenger-share", "0", "--request-log", "", "--seed", "0"],
                           rules.startup_timeout_s, "torchship-smoke-")


def replay(url: str, rows: pd.DataFrame, target: str) -> pd.DataFrame:
    """One request per row; returns variant, version, correctness, latency and status per request."""
    import httpx

    records = []
    features = rows.drop(columns=[target])
    payloads = features.astype(object).where(features.notna(), None).to_dict(orient="records")
    with httpx.Client(base_url=url, timeout=10.0) as client:
        for payload, truth in zip(payloads, rows[target].astype(str)):
            started = time.perf_counter()
            try:
                response = client.post("/predict", json={"rows": [payload]})
                ok = response.status_code == 200
                body = response.json() if ok else {}
            except httpx.HTTPError:
                ok, body = False, {}
            shadow = body.get("shadow") or {}
            records.append({"variant": body.get("variant", "unknown"), "version": body.get("version", ""),
                            "ok": ok, "correct": ok and body["predictions"][0]["label"] == truth,
                            # The answering variant's own time, measured by the service: shadow scoring of
                            # the other variant happens in the same request and must not blur the comparison.
                            "ms": body.get("served_ms", (time.perf_counter() - started) * 1e3),
                            "shadow_variant": shadow.get("variant"),
                            "shadow_correct": bool(shadow) and shadow["labels"][0] == truth})
    return pd.DataFrame(records)


def analyse(traffic: pd.DataFrame, rules: CanaryParams) -> tuple[GateResult, dict[str, VariantTraffic]]:
    """Pure core: compare the challenger's traffic with the champion's."""
    summary = {}
    for variant, group in traffic.groupby("variant"):
        served = group[group["ok"]]
        # With shadow scoring, each variant is judged on every row (paired with the other): far less noise
        # than comparing accuracies on two disjoint random halves of the traffic.
        correct = served["correct"].tolist()
        if "shadow_variant" in traffic:
            correct += traffic.loc[traffic["shadow_variant"] == variant, "shadow_correct"].tolist()
        summary[variant] = VariantTraffic(
            version=str(group["version"].iloc[0]), requests=len(group), errors=int((~group["ok"]).sum()),
            accuracy=float(sum(correct) / len(correct)) if correct else 0.0,
            p50_ms=float(np.percentile(group["ms"], 50)), p95_ms=float(np.percentile(group["ms"], 95)))
    champion, challenger = summary.get("champion"), summary.get("challenger")
    failures = []
    unattributed = summary.get("unknown")
    if unattributed is not None and unattributed.errors:
        failures.append(f"{unattributed.errors} requests failed before a variant answered")
    if challenger is None or champion is None:
        failures.append("the traffic split gave one variant no requests; raise canary.requests")
        return GateResult.decide("canary", failures), summary
    error_rate = challenger.errors / challenger.requests
    if error_rate > rules.max_error_rate:
        failures.append(f"challenger error rate {error_rate:.2%} > {rules.max_error_rate:.2%}")
    if challenger.accuracy < champion.accuracy - rules.max_metric_drop:
        failures.append(f"challenger accuracy {challenger.accuracy:.3f} < champion {champion.accuracy:.3f} "
                        f"- {rules.max_metric_drop}")
    if challenger.p95_ms > rules.max_p95_ratio * champion.p95_ms:
        failures.append(f"challenger p95 {challenger.p95_ms:.1f} ms > {rules.max_p95_ratio}x champion "
                        f"{champion.p95_ms:.1f} ms")
    passed = (f"challenger v{challenger.version} acc {challenger.accuracy:.3f} vs champion v{champion.version} "
              f"{champion.accuracy:.3f}, p95 {challenger.p95_ms:.1f} vs {champion.p95_ms:.1f} ms, no errors")
    return GateResult.decide("canary", failures, passed=passed), summary


def smoke_test(params: Params, rows: pd.DataFrame, target: str, client, name: str, started: float) -> CanaryReport:
    """No challenger: the champion alone answers the replayed rows through a service started for it."""
    with smoke_service(name, params.canary) as url:
        traffic = replay(url, rows, target)
    champion = traffic[traffic["variant"] == "champion"]
    errors = int((~traffic["ok"]).sum())
    gate = GateResult.decide("canary", [f"{errors} of {len(traffic)} requests failed"] if errors else [],
                             passed=f"champion answered {len(champion)} requests, "
                                    f"accuracy {champion['correct'].mean():.3f}")
    _, summary = analyse(traffic, params.canary)
    return CanaryReport(gate=gate, action=SMOKE_ONLY, traffic=summary, aliases=aliases(client, name),
                        seconds=time.perf_counter() - started)


def signature_difference(client, name: str, champion: str, challenger: str) -> str | None:
    """Why the two versions are not comparable (input signature or classes), or None when they are."""
    from tasks.core.registry import open_version

    ours, theirs = (open_version(client, name, version, 1)[1] for version in (challenger, champion))
    if ours.signature() != theirs.signature():
        added = sorted(set(ours.signature()) - set(theirs.signature()))
        gone = sorted(set(theirs.signature()) - set(ours.signature()))
        return (f"v{challenger}'s input signature differs from champion v{champion}'s (only the challenger: "
                f"{added[:5]}; only the champion: {gone[:5]})")
    if ours.classes != theirs.classes:
        return f"v{challenger}'s classes {ours.classes} differ from champion v{champion}'s {theirs.classes}"
    return None


def run_canary(params: Params, holdout_rows: pd.DataFrame, schema: Schema, link: ServiceLink | None = None,
               record: Record | None = None) -> CanaryReport:
    """Smoke-test the champion alone, or run the progressive canary of the challenger against it and act on the
    registry. `link`: a running service whose live traffic is observed; None (the embedded default): a service
    started for the canary, fed with replayed holdout rows. `record` is called with each step's verdict.
    Requests carry the model's features only (a contract's key column is data, not a feature)."""
    started = time.perf_counter()
    client = registry_client(params.tracking)
    name = params.data.registered_model_name()
    challenger, champion = alias_version(client, name, CHALLENGER), alias_version(client, name, CHAMPION)

    def report(gate: GateResult, action: str, steps: list | None = None) -> CanaryReport:
        return CanaryReport(gate=gate, action=action, steps=steps or [], aliases=aliases(client, name),
                            seconds=time.perf_counter() - started)

    if champion is None:   # e.g. a first model that bless refused: nothing to serve
        return report(GateResult(gate="canary", status="pass", reasons=["nothing to serve or compare"]),
                      "skipped: no champion")
    target = schema.target
    rows = holdout_rows[schema.feature_names + [target]]
    rows = rows.sample(n=min(params.canary.requests, len(rows)), random_state=0)
    if challenger is None:
        if link is not None:
            return report(GateResult(gate="canary", status="pass", reasons=["no challenger to canary"]),
                          "skipped: no challenger")
        return smoke_test(params, rows, target, client, name, started)
    versions = str(champion.version), str(challenger.version)
    if (difference := signature_difference(client, name, *versions)) is not None:
        return report(GateResult(gate="canary", status="fail", reasons=[difference]),
                      f"not run: {difference}; nothing moved (a new table needs `torchship rebaseline`)")

    def steps(service: ServiceLink, traffic) -> CanaryReport:
        service.wait_serving(*versions, params.canary.startup_timeout_s)

        def on_step(verdict) -> None:
            tag_step(client, name, versions[1], verdict)
            if record is not None:
                record(verdict)

        verdicts = run_steps(service, *versions, params.canary, traffic, on_step)
        gate, action = decide(client, name, versions[1], verdicts, params.canary)
        return report(gate, action, verdicts)

    if link is not None:
        return steps(link, None)
    with embedded_service(name, params.canary.startup_timeout_s) as service:
        traffic = ReplayTraffic(service.url, rows[schema.feature_names], rows[target])
        try:
            return steps(service, traffic)
        finally:
            traffic.close()


def run(params: Params, parent_run: str | None = None, link: ServiceLink | None = None,
        record: Record | None = None) -> CanaryReport:
    """The step: the canary (see run_canary), logged as a nested MLflow run."""
    import mlflow

    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    with stage_run(params.tracking, "canary", parent_run):
        report = run_canary(params, load_holdout(schema).rows, schema, link, record)
        mlflow.log_dict(report.model_dump(), "canary.json")
        mlflow.set_tag("gate.status", report.gate.status)
    log.info("canary: %s -> %s", report.gate.summary(), report.action)
    return report
