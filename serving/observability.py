"""For the on-call engineer: a Grafana dashboard over the service's metrics (serving/metrics.py) and Prometheus
alert rules derived from the `slo` (and `monitor`) params, with a promtool unit-test file proving that the rules
fire on a breach and stay quiet otherwise. Pure: params in, JSON/YAML-ready dicts out (`torchship observability`
writes them; docs/observability/ holds the copies generated from params.yaml).

Error rate here is the service's fault: 5xx answers (`error`, `unavailable`) over every /predict answer. A
client sending bad rows (422) or an oversized body (413) does not page anyone; the dashboard shows those beside.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field

from serving.metrics import FAILED_STATUSES, LATENCY_BUCKETS
from tasks.core.errors import ConfigError
from tasks.core.params_spec import MonitorParams, SloParams

RATE = "$__rate_interval"      # Grafana's window: at least 4 scrapes (bench/bench_dashboard.py sets its own)
ALERT_WINDOW = "5m"            # rate window of the paging rules: long enough that one slow second is not a page
ALERT_FOR = "5m"               # and held this long before it pages
TICKET_WINDOW = "15m"
RULES_FILE, TESTS_FILE, DASHBOARD_FILE = "alerts.yml", "alerts.test.yml", "dashboard.json"

REQUESTS = "torchship_requests_total"
ANSWERED = f'{REQUESTS}{{status!="shadow-error"}}'
FAILED = f'{REQUESTS}{{status=~"{"|".join(FAILED_STATUSES)}"}}'
NOT_OK = f'{REQUESTS}{{status!~"ok|shadow-error"}}'
BUCKETS = "torchship_request_seconds_bucket"
PREDICTIONS = "torchship_predictions_total"
# alert -> the anchor of its section in docs/runbooks.md (GitHub's heading slug; tests/unit/test_observability.py
# checks that each exists)
RUNBOOK_ANCHORS = {"TorchshipP99LatencyHigh": "a-tail-latency-spike", "TorchshipErrorRateHigh": "a-5xx-page",
                   "TorchshipDriftDetected": "a-drift-alert",
                   "TorchshipModelLoadFailed": "a-model-that-fails-to-load-after-an-upgrade",
                   "TorchshipChampionUnblessed": "a-bad-promotion"}


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: list[tuple[str, str]]          # (PromQL, legend)
    threshold: float | None = None           # the objective, drawn as a line
    stacked: bool = False
    extra: dict = field(default_factory=dict)


def quantile(q: float, window: str = RATE) -> str:
    return f"histogram_quantile({q}, sum by (variant, le) (rate({BUCKETS}[{window}])))"


def share(part: str, window: str, by: str = "") -> str:
    """`part`'s share of all answers; 0 (not an empty result) while `part` has no series yet."""
    group = f" by ({by})" if by else ""
    answered = f"sum{group} (rate({ANSWERED}[{window}]))"
    return f"(sum{group} (rate({part}[{window}])) or {answered} * 0) / {answered}"


def error_rate(window: str) -> str:
    return share(FAILED, window)


def panels(slo: SloParams, monitor: MonitorParams) -> list[Panel]:
    """The dashboard's panels, in reading order."""
    per_variant = f"sum by (variant) (rate({PREDICTIONS}[{RATE}]))"
    return [
        Panel("Request rate by variant and status", "/predict answers per second; refused ones (invalid: 422/400, "
              "too-large: 413) and failed ones (error: 500, unavailable: 503) beside the served (ok).", "reqps",
              [(f"sum by (variant, status) (rate({ANSWERED}[{RATE}]))", "{{variant}} {{status}}")]),
        Panel("Latency p95 / p99 by variant", f"Arrival to answer, in the service (the client adds the network). "
              f"Line: slo.p99_ms = {slo.p99_ms:g} ms; the page fires when p99 stays above it for {ALERT_FOR}.", "s",
              [(quantile(0.95), "p95 {{variant}}"), (quantile(0.99), "p99 {{variant}}")], threshold=slo.p99_ms / 1e3),
        Panel("Error rate", f"The service's fault (5xx) over all answers (line: slo.max_error_rate = "
              f"{slo.max_error_rate:g}); and per variant every non-2xx share, refused rows included (a challenger "
              f"whose schema refuses live rows shows here).", "percentunit",
              [(error_rate(RATE), "5xx, all"),
               (share(NOT_OK, RATE, "variant"), "non-2xx {{variant}}")], threshold=slo.max_error_rate),
        Panel("Traffic split", "Share of served requests per variant (champion / challenger during a canary).",
              "percentunit", [(f'sum by (variant) (rate({REQUESTS}{{status="ok"}}[{RATE}])) / scalar(sum '
                               f'(rate({REQUESTS}{{status="ok"}}[{RATE}])))', "{{variant}}")], stacked=True),
        Panel("Model versions, reloads and load failures", "The version behind each alias; alias moves picked up "
              "and versions refused (sha256 mismatch, not loadable: the current one kept serving), since start.",
              "short", [("torchship_model_version", "{{alias}} version"),
                        ("torchship_model_reloads_total", "reloads {{alias}}"),
                        ("torchship_model_load_failures_total", "load failures {{alias}}")]),
        Panel("Prediction distribution by variant", "Share of each predicted label among a variant's served rows: "
              "a shift between variants, or over time, shows here before any label comes back.", "percentunit",
              [(f"sum by (variant, label) (rate({PREDICTIONS}[{RATE}])) / on (variant) group_left {per_variant}",
                "{{variant}} {{label}}")]),
        Panel("Drift (torchship monitor)", f"Share of drifted features in the newest monitored window (line: "
              f"monitor.max_drifted_share = {monitor.max_drifted_share:g}) and the drift gate's verdict (1 = "
              f"failed: a ticket).", "short",
              [("torchship_drift_share", "drifted share"), ("torchship_drift_detected", "drift detected")],
              threshold=monitor.max_drifted_share),
        Panel("Estimated accuracy drop (label-free)", f"How far the newest monitored window's estimated accuracy "
              f"(from the served probabilities: no labels needed, valid while P(y|x) holds) lies "
              f"below the champion's holdout accuracy (line: monitor.max_estimated_drop = "
              f"{monitor.max_estimated_drop:g}: above it the drift gate fails).", "percentunit",
              [("torchship_estimated_accuracy_drop", "estimated drop"),
               ("torchship_estimated_accuracy", "estimated accuracy")], threshold=monitor.max_estimated_drop),
    ]


def grafana_panel(index: int, panel: Panel) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if panel.stacked else 0,
              "stacking": {"mode": "normal" if panel.stacked else "none"},
              "thresholdsStyle": {"mode": "line" if panel.threshold is not None else "off"}}
    steps = [{"color": "green", "value": None}]
    if panel.threshold is not None:
        steps.append({"color": "red", "value": panel.threshold})
    return {"id": index + 1, "type": "timeseries", "title": panel.title, "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit, "custom": custom,
                                         "thresholds": {"mode": "absolute", "steps": steps}}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (expr, legend) in enumerate(panel.queries)]}


def dashboard(slo: SloParams, monitor: MonitorParams) -> dict:
    """The Grafana dashboard (import it, pick the Prometheus data source that scrapes the service)."""
    return {"title": "torchship service", "uid": "torchship-service", "tags": ["torchship"], "editable": True,
            "schemaVersion": 39, "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
            "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                     "query": "prometheus"}]},
            "panels": [grafana_panel(i, p) for i, p in enumerate(panels(slo, monitor))]}


def alert_rules(slo: SloParams, monitor: MonitorParams) -> dict:
    """Prometheus rule groups: page on a p99 or error-rate breach of the SLO, ticket on drift, a refused load or an
    unblessed champion; each rule's `runbook_url` is its section of the runbooks under `slo.runbook_base_url`."""
    p99 = slo.p99_ms / 1e3
    if p99 >= LATENCY_BUCKETS[-1]:
        raise ConfigError(f"slo.p99_ms = {slo.p99_ms:g}: the latency histogram's largest bucket is "
                          f"{LATENCY_BUCKETS[-1] * 1e3:g} ms, so no breach could be seen; lower slo.p99_ms or add a "
                          f"bucket in serving/metrics.py")
    page = {"severity": "page"}
    ticket = {"severity": "ticket"}
    groups = [
        {"name": "torchship-slo", "rules": [
            {"alert": "TorchshipP99LatencyHigh", "expr": f"{quantile(0.99, ALERT_WINDOW)} > {p99:g}",
             "for": ALERT_FOR, "labels": page,
             "annotations": {"summary": "torchship /predict p99 latency above the SLO",
                             "description": f"p99 over {ALERT_WINDOW} above slo.p99_ms = {slo.p99_ms:g} ms for "
                                            f"{ALERT_FOR} (per variant: a challenger's breach pages too)."}},
            {"alert": "TorchshipErrorRateHigh", "expr": f"{error_rate(ALERT_WINDOW)} > {slo.max_error_rate:g}",
             "for": ALERT_FOR, "labels": page,
             "annotations": {"summary": "torchship /predict failing",
                             "description": f"5xx share over {ALERT_WINDOW} above slo.max_error_rate = "
                                            f"{slo.max_error_rate:g} for {ALERT_FOR}."}}]},
        {"name": "torchship-model", "rules": [
            {"alert": "TorchshipDriftDetected", "expr": "torchship_drift_detected == 1", "labels": ticket,
             "annotations": {"summary": "served traffic drifted from the training data",
                             "description": f"The newest `torchship monitor` window failed the drift gate "
                                            f"(monitor.max_drifted_share = {monitor.max_drifted_share:g}, or the "
                                            f"label-free accuracy estimate's drop > monitor.max_estimated_drop = "
                                            f"{monitor.max_estimated_drop:g}); see data/monitor/latest.json and its "
                                            f"Evidently report."}},
            {"alert": "TorchshipModelLoadFailed",
             "expr": f"increase(torchship_model_load_failures_total[{TICKET_WINDOW}]) > 0", "labels": ticket,
             "annotations": {"summary": "a registered version was refused by the service",
                             "description": "An alias moved to a version the service refused (sha256 mismatch "
                                            "or not loadable); the previous one keeps serving. See the "
                                            "service log."}},
            {"alert": "TorchshipChampionUnblessed", "expr": "torchship_champion_unblessed == 1", "labels": ticket,
             "annotations": {"summary": "the champion is a version bless did not pass, or one rejected",
                             "description": "Someone made it champion by hand (the MLflow UI, `torchship promote "
                                            "--force`): it keeps serving, as they decided. See `torchship "
                                            "history` for who and when; `torchship rollback` undoes it."}}]}]
    for rule in (rule for group in groups for rule in group["rules"]):
        rule["annotations"]["runbook_url"] = f"{slo.runbook_base_url}#{RUNBOOK_ANCHORS[rule['alert']]}"
    return {"groups": groups}


def _expected(rules: dict, name: str, labels: dict) -> dict:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == name)
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": rule["annotations"]}


def _latency_series(p99: float) -> list[dict]:
    """Cumulative buckets over 20 minutes: variant `slow` answers above the objective (in the bucket after the
    one holding it, so interpolation cannot land below), `fast` in the first bucket."""
    bounds = [*LATENCY_BUCKETS, math.inf]
    above = next(i for i, b in enumerate(bounds) if b > p99)
    slow_from = min(above + 1, len(bounds) - 1)
    series = []
    for variant, first in (("slow", slow_from), ("fast", 0)):
        for i, bound in enumerate(bounds):
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            per_minute = 600 if i >= first else 0
            series.append({"series": f'{BUCKETS}{{variant="{variant}",le="{le}"}}', "values": f"0+{per_minute}x20"})
    return series


def rule_tests(slo: SloParams, monitor: MonitorParams) -> dict:
    """promtool's unit tests of `alert_rules`: each alert fires on its breach (and only after its `for`), and
    stays silent on healthy series."""
    rules = alert_rules(slo, monitor)
    failing_per_minute = math.ceil(1000 * 2 * slo.max_error_rate / max(1e-9, 1 - slo.max_error_rate)) + 1
    requests = [{"series": f'{REQUESTS}{{variant="champion",version="1",status="ok"}}', "values": "0+1000x20"},
                {"series": f'{REQUESTS}{{variant="-",version="-",status="error"}}',
                 "values": f"0+{failing_per_minute}x20"}]
    healthy = [{"series": f'{REQUESTS}{{variant="champion",version="1",status="ok"}}', "values": "0+1000x20"},
               {"series": f'{REQUESTS}{{variant="champion",version="1",status="invalid"}}', "values": "0+500x20"},
               {"series": "torchship_drift_detected", "values": "0x20"},
               {"series": 'torchship_model_load_failures_total{alias="champion"}', "values": "0x20"},
               {"series": "torchship_champion_unblessed", "values": "0x20"},
               *[s for s in _latency_series(slo.p99_ms / 1e3) if 'variant="fast"' in s["series"]]]
    names = [r["alert"] for g in rules["groups"] for r in g["rules"]]
    tests = [
        {"interval": "1m", "input_series": _latency_series(slo.p99_ms / 1e3), "alert_rule_test": [
            {"eval_time": "3m", "alertname": "TorchshipP99LatencyHigh", "exp_alerts": []},   # pending, not paging
            {"eval_time": "15m", "alertname": "TorchshipP99LatencyHigh",
             "exp_alerts": [_expected(rules, "TorchshipP99LatencyHigh", {"variant": "slow"})]}]},
        {"interval": "1m", "input_series": [
            {"series": "torchship_drift_detected", "values": "0x5 1x15"},
            {"series": 'torchship_model_load_failures_total{alias="challenger"}', "values": "0x5 1x15"},
            {"series": "torchship_champion_unblessed", "values": "0x5 1x15"}],
         "alert_rule_test": [
             {"eval_time": "4m", "alertname": "TorchshipDriftDetected", "exp_alerts": []},
             {"eval_time": "10m", "alertname": "TorchshipDriftDetected",
              "exp_alerts": [_expected(rules, "TorchshipDriftDetected", {})]},
             {"eval_time": "10m", "alertname": "TorchshipModelLoadFailed",
              "exp_alerts": [_expected(rules, "TorchshipModelLoadFailed", {"alias": "challenger"})]},
             {"eval_time": "4m", "alertname": "TorchshipChampionUnblessed", "exp_alerts": []},
             {"eval_time": "10m", "alertname": "TorchshipChampionUnblessed",
              "exp_alerts": [_expected(rules, "TorchshipChampionUnblessed", {})]}]},
        {"interval": "1m", "input_series": healthy, "alert_rule_test": [
            {"eval_time": "15m", "alertname": name, "exp_alerts": []} for name in names]}]
    if slo.max_error_rate < 1.0:   # an objective of 100 % failures cannot be breached
        tests.insert(1, {"interval": "1m", "input_series": requests, "alert_rule_test": [
            {"eval_time": "15m", "alertname": "TorchshipErrorRateHigh",
             "exp_alerts": [_expected(rules, "TorchshipErrorRateHigh", {})]}]})
    return {"rule_files": [RULES_FILE], "evaluation_interval": "1m", "tests": tests}


def to_yaml(document: dict) -> str:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.width = 4096   # one PromQL expression per line
    yaml.sort_base_mapping_type_on_output = False   # alert, expr, for, labels, annotations: as written
    yaml.representer.ignore_aliases = lambda *args: True   # no &id001 anchors for repeated label sets
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


def observability_files(slo: SloParams, monitor: MonitorParams) -> dict[str, str]:
    """file name -> content: the dashboard, the alert rules and their promtool tests."""
    header = "# Generated by `torchship observability` from params.yaml (slo, monitor): do not edit by hand.\n"
    return {DASHBOARD_FILE: json.dumps(dashboard(slo, monitor), indent=2) + "\n",
            RULES_FILE: header + to_yaml(alert_rules(slo, monitor)),
            TESTS_FILE: header + to_yaml(rule_tests(slo, monitor))}


def metric_names(files: dict[str, str]) -> set[str]:
    """Every torchship metric the dashboard and the rules read (series names of the test file excluded)."""
    import re

    text = files[DASHBOARD_FILE] + files[RULES_FILE]
    return set(re.findall(r"\btorchship_[a-z_]+\b", text))
