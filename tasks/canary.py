"""canary: serve champion + challenger for real on 127.0.0.1, replay holdout rows, promote or roll back.
(Prefect-only: it acts on live registry state.)"""
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
from tasks.core.verdicts import CanaryReport, VariantTraffic
from tasks.ops.registry import alias_lock, promote, reject

log = logging.getLogger("torchship.canary")
SMOKE_ONLY = "smoke test only (no challenger)"


def canary_service(model_name: str, share: float, rules: CanaryParams, seed: int = 0):
    """The service for a canary: a split of traffic, shadow scoring, no request log (replayed rows are not
    production traffic)."""
    return running_service(model_name, ["--challenger-share", str(share), "--request-log", "", "--seed", str(seed),
                                        "--shadow"], rules.startup_timeout_s, "torchship-canary-")


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


def run_canary(params: Params, holdout_rows: pd.DataFrame, schema: Schema) -> CanaryReport:
    """Smoke-test the champion alone, or canary the challenger against it and act on the result.
    Requests carry the model's features only (a contract's key column is data, not a feature)."""
    started = time.perf_counter()
    client = registry_client(params.tracking)
    name = params.data.registered_model_name()
    challenger = alias_version(client, name, CHALLENGER)
    if alias_version(client, name, CHAMPION) is None:   # e.g. a first model that bless refused: nothing to serve
        gate = GateResult(gate="canary", status="pass", reasons=["nothing to serve or compare"])
        return CanaryReport(gate=gate, action="skipped: no champion", traffic={}, aliases=aliases(client, name),
                            seconds=time.perf_counter() - started)
    target = schema.target
    rows = holdout_rows[schema.feature_names + [target]]
    rows = rows.sample(n=min(params.canary.requests, len(rows)), random_state=0)
    share = params.canary.challenger_share if challenger is not None else 0.0
    with canary_service(name, share, params.canary) as url:
        traffic = replay(url, rows, target)
    if challenger is None:
        champion = traffic[traffic["variant"] == "champion"]
        errors = int((~traffic["ok"]).sum())
        gate = GateResult.decide("canary", [f"{errors} of {len(traffic)} requests failed"] if errors else [],
                                 passed=f"champion answered {len(champion)} requests, "
                                        f"accuracy {champion['correct'].mean():.3f}")
        _, summary = analyse(traffic, params.canary)
        return CanaryReport(gate=gate, action=SMOKE_ONLY, traffic=summary, aliases=aliases(client, name),
                            seconds=time.perf_counter() - started)
    gate, summary = analyse(traffic, params.canary)
    with alias_lock(client):
        still = alias_version(client, name, CHALLENGER)
        if still is None or str(still.version) != str(challenger.version):
            action = (f"nothing moved: `challenger` left v{challenger.version} during the canary "
                      f"(now {'v' + str(still.version) if still else 'none'}); its verdict is recorded only here")
        elif gate.status == "fail":
            reject(client, name, challenger.version, "canary: " + "; ".join(gate.reasons))
            action = f"rolled back: v{challenger.version} rejected, champion unchanged"
        else:
            old = promote(client, name, challenger.version, "canary: " + "; ".join(gate.reasons))
            action = f"promoted v{challenger.version} to champion (v{old} tagged previous)"
    return CanaryReport(gate=gate, action=action, traffic=summary, aliases=aliases(client, name),
                            seconds=time.perf_counter() - started)


def run(params: Params, parent_run: str | None = None) -> CanaryReport:
    """The step: canary on the holdout's rows, logged as a nested MLflow run."""
    import mlflow

    from tasks.core.tracking import stage_run

    schema = load_schema(paths.SCHEMA)
    with stage_run(params.tracking, "canary", parent_run):
        report = run_canary(params, load_holdout(schema).rows, schema)
        mlflow.log_dict(report.model_dump(), "canary.json")
        mlflow.set_tag("gate.status", report.gate.status)
    log.info("canary: %s -> %s", report.gate.summary(), report.action)
    return report
