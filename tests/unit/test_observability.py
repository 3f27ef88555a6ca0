"""The on-call engineer's dashboard and alert rules (serving/observability.py): the committed copies are what
params.yaml generates; promtool accepts the rules and their unit tests pass (and fail on a broken rule); the
thresholds follow the params; the drift verdict and predicted labels become metrics."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import Metrics
from serving.observability import DASHBOARD_FILE, RULES_FILE, TESTS_FILE, alert_rules, metric_names, observability_files
from tasks.config import load_params
from tasks.core.errors import ConfigError
from tasks.core.params_spec import MonitorParams, SloParams
from tests.conftest import REPO

COMMITTED = REPO / "docs" / "observability"


def promtool() -> str:
    """promtool's path; skipped (naming the package) where it is missing, a failure on CI."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing on CI: install Debian's `prometheus` package (make test does)")
        pytest.skip("promtool not installed: it comes with Debian's `prometheus` package (apt-get install prometheus)")
    return found


def written(folder, files: dict[str, str]):
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def test_the_committed_dashboard_and_rules_are_what_the_command_generates_from_params_yaml(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    saved = dict(os.environ)
    monkeypatch.chdir(REPO)
    try:
        result = CliRunner().invoke(app, ["observability", "--out", str(tmp_path)])
    finally:   # the command sets the project's environment (Prefect home, telemetry)
        os.environ.clear()
        os.environ.update(saved)
    assert result.exit_code == 0, result.output
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert generated == observability_files(*_params())
    assert {p.name for p in COMMITTED.iterdir() if p.suffix in (".json", ".yml")} == set(generated)
    for name, content in generated.items():
        assert (COMMITTED / name).read_text() == content, f"docs/observability/{name} is stale: run `torchship " \
                                                          f"observability --out docs/observability`"


def _params() -> tuple[SloParams, MonitorParams]:
    params = load_params(REPO / "params.yaml")
    return params.slo, params.monitor


def test_promtool_accepts_the_rules_and_their_unit_tests_pass(tmp_path):
    tool = promtool()
    folder = written(tmp_path, observability_files(*_params()))
    checked = subprocess.run([tool, "check", "rules", str(folder / RULES_FILE)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = sum(len(group["rules"]) for group in alert_rules(*_params())["groups"])
    assert rules >= 5 and f"SUCCESS: {rules} rules found" in checked.stdout
    tested = subprocess.run([tool, "test", "rules", TESTS_FILE], cwd=folder, capture_output=True, text=True,
                            timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_tests_fail_when_a_rule_no_longer_pages_on_its_breach(tmp_path):
    tool = promtool()
    slo, monitor = _params()
    files = observability_files(slo, monitor)
    files[RULES_FILE] = files[RULES_FILE].replace(f"> {slo.p99_ms / 1e3:g}", "> 100")   # p99 can never exceed it
    tested = subprocess.run([tool, "test", "rules", TESTS_FILE], cwd=written(tmp_path, files), capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode != 0 and "TorchshipP99LatencyHigh" in tested.stdout + tested.stderr


def test_thresholds_follow_the_slo_params():
    rules = alert_rules(SloParams(p99_ms=40, max_error_rate=0.002), MonitorParams(max_drifted_share=0.6))
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert by_name["TorchshipP99LatencyHigh"]["expr"].endswith("> 0.04")
    assert by_name["TorchshipErrorRateHigh"]["expr"].endswith("> 0.002")
    assert by_name["TorchshipP99LatencyHigh"]["labels"] == {"severity": "page"}
    assert by_name["TorchshipDriftDetected"]["labels"] == {"severity": "ticket"}
    assert by_name["TorchshipChampionUnblessed"]["labels"] == {"severity": "ticket"}   # a person decided: no page
    assert "0.6" in by_name["TorchshipDriftDetected"]["annotations"]["description"]
    with pytest.raises(ConfigError, match="largest bucket"):
        alert_rules(SloParams(p99_ms=60_000), MonitorParams())


def test_the_dashboard_has_the_on_call_panels_over_exported_metric_names():
    files = observability_files(*_params())
    board = json.loads(files[DASHBOARD_FILE])
    titles = [p["title"] for p in board["panels"]]
    assert titles == ["Request rate by variant and status", "Latency p95 / p99 by variant", "Error rate",
                      "Traffic split", "Model versions, reloads and load failures",
                      "Prediction distribution by variant", "Drift (torchship monitor)",
                      "Estimated accuracy drop (label-free)"]
    latency = board["panels"][1]
    assert latency["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == _params()[0].p99_ms / 1e3
    assert metric_names(files) == {"torchship_requests_total", "torchship_request_seconds_bucket",
                                   "torchship_predictions_total", "torchship_model_version",
                                   "torchship_model_reloads_total", "torchship_model_load_failures_total",
                                   "torchship_drift_share", "torchship_drift_detected",
                                   "torchship_estimated_accuracy", "torchship_estimated_accuracy_drop",
                                   "torchship_champion_unblessed"}


def samples(metrics: Metrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.exposition().decode()) for s in family.samples}


def test_the_monitor_verdict_is_exported_when_scraped_and_follows_the_file(tmp_path):
    report = tmp_path / "latest.json"
    metrics = Metrics(drift_report=report)
    assert not [k for k in samples(metrics) if k[0].startswith("torchship_drift")]   # no monitor run yet
    report.write_text(json.dumps({"gate": {"status": "fail"}, "findings": {"drifted_share": 0.45}}))
    found = samples(metrics)
    assert found[("torchship_drift_share", ())] == 0.45 and found[("torchship_drift_detected", ())] == 1.0
    later = time.time() + 5
    report.write_text(json.dumps({"gate": {"status": "pass"}, "findings": {"drifted_share": 0.1}}))
    os.utime(report, (later, later))
    found = samples(metrics)
    assert found[("torchship_drift_detected", ())] == 0.0 and found[("torchship_drift_share", ())] == 0.1
    assert found[("torchship_drift_checked_timestamp_seconds", ())] == pytest.approx(later)
    assert ("torchship_estimated_accuracy", ()) not in found   # the window's log carried no probabilities
    findings = {"drifted_share": 0.0, "estimate": {"accuracy": 0.81, "drop": 0.06}}
    report.write_text(json.dumps({"gate": {"status": "fail"}, "findings": findings}))
    os.utime(report, (later + 5, later + 5))
    found = samples(metrics)
    assert found[("torchship_estimated_accuracy", ())] == 0.81
    assert found[("torchship_estimated_accuracy_drop", ())] == 0.06


def test_predicted_labels_are_counted_per_variant_and_failures_start_at_zero(tmp_path):
    metrics = Metrics(drift_report=None)
    metrics.predictions.add("champion", ["yes"])
    metrics.predictions.add("champion", ["no", "yes", "yes"])
    metrics.predictions.add("challenger", ["no"])
    found = samples(metrics)
    assert found[("torchship_predictions_total", (("label", "yes"), ("variant", "champion")))] == 3
    assert found[("torchship_predictions_total", (("label", "no"), ("variant", "champion")))] == 1
    assert found[("torchship_predictions_total", (("label", "no"), ("variant", "challenger")))] == 1
    assert found[("torchship_model_load_failures_total", (("alias", "challenger"),))] == 0


def heading_anchors(markdown: str) -> set[str]:
    """The anchors a Git host gives `## ` headings: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)}


def test_every_alert_links_its_section_of_the_runbooks_under_the_configured_base_url():
    slo, monitor = _params()
    anchors = heading_anchors((REPO / "docs" / "runbooks.md").read_text())
    rules = [r for g in alert_rules(slo, monitor)["groups"] for r in g["rules"]]
    for rule in rules:
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == slo.runbook_base_url and anchor in anchors, (rule["alert"], anchor, sorted(anchors))
    assert len({r["annotations"]["runbook_url"] for r in rules}) == len(rules), "two alerts share one runbook"
    hosted = alert_rules(SloParams(runbook_base_url="https://git.example/torchship/docs/runbooks.md"), monitor)
    assert {r["annotations"]["runbook_url"].partition("#")[0] for g in hosted["groups"] for r in g["rules"]} == \
        {"https://git.example/torchship/docs/runbooks.md"}
