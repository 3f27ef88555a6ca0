"""Every metric the dashboard and the alert rules read is exported by the real service's /metrics after some
traffic (the app in-process over the tiny pipeline's registry, a monitor verdict on disk)."""
from __future__ import annotations

import json
import warnings

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.app import create_app
from serving.observability import metric_names, observability_files
from serving.service import ServiceSettings
from tasks.config import load_params
from tasks.core.params_spec import ServeParams, TrackingParams
from tests.conftest import REPO
from tests.helpers import holdout_rows

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 behind its TestClient; httpx still works
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration


def exported_names(text: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_every_metric_of_the_dashboard_and_rules_is_exported_after_traffic(tiny_pipeline, tmp_path, monkeypatch):
    project, _ = tiny_pipeline
    monitor = tmp_path / "data" / "monitor"   # the service reads the monitor's verdict relative to its folder
    monitor.mkdir(parents=True)
    (monitor / "latest.json").write_text(json.dumps({"gate": {"status": "pass"}, "findings": {
        "drifted_share": 0.0, "estimate": {"accuracy": 0.81, "drop": 0.01}}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    settings = ServiceSettings(serve=ServeParams(poll_seconds=30, request_log=""), model_name="synthetic-churn",
                               tracking=TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"))
    params = load_params(REPO / "params.yaml")
    wanted = metric_names(observability_files(params.slo, params.monitor))
    with TestClient(create_app(settings)) as client:
        for row in holdout_rows(project, 5):
            assert client.post("/predict", json={"rows": [row]}).status_code == 200
        assert client.post("/predict", json={"rows": [{"nope": 1}]}).status_code == 422
        exported = exported_names(client.get("/metrics").text)
    assert wanted - exported == set(), f"named by the dashboard or rules, not exported: {wanted - exported}"
