"""The real service: `python -m serving` under uvicorn on 127.0.0.1, all traffic to the champion.
One prediction, and a promotion done by hand in the registry followed without a failed request. Everything
else about the service is tested in-process (test_service_inprocess.py)."""
from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from tasks.core.procs import http_ok, start_child, wait_until_ready
from tests.helpers import champion_bytes, free_port, holdout_rows, promote_by_hand

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"


@pytest.fixture(scope="module")
def service(tiny_pipeline, tmp_path_factory):
    """(project, url) of a running service; stopped by PID (its whole process group) afterwards."""
    project, _ = tiny_pipeline
    port = free_port()
    command = [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(port), "--model-name", MODEL,
               "--challenger-share", "0", "--request-log", "", "--seed", "0", "--poll-seconds", "0.5"]
    child = start_child("service", command, tmp_path_factory.mktemp("serve") / "service.log", cwd=project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(child, http_ok(f"{url}/health", lambda body: body.get("champion")), timeout=60)
        yield project, url
    finally:
        child.stop()
    assert "Traceback" not in child.output_tail(20_000), child.output_tail()


def test_predict_through_the_real_server(service):
    project, url = service
    response = httpx.post(f"{url}/predict", json={"rows": holdout_rows(project)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == "champion"
    assert abs(sum(body["predictions"][0]["probabilities"].values()) - 1) < 1e-5


def test_promotion_by_hand_is_followed_without_a_failed_request(service):
    project, url = service
    current = httpx.get(f"{url}/health").json()["champion"]
    registry = ("import mlflow\nfrom mlflow import MlflowClient\n"
                "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\nc = MlflowClient()\n")
    # The champion's bytes again as a new version, promoted by hand (another process, as the MLflow UI would).
    new = promote_by_hand(project, MODEL, champion_bytes(MODEL))
    row = holdout_rows(project)[0]
    try:
        assert new != current
        statuses, served, deadline = [], current, time.monotonic() + 30
        while served != new and time.monotonic() < deadline:
            response = httpx.post(f"{url}/predict", json={"rows": [row]})
            statuses.append(response.status_code)
            served = response.json().get("version")
        assert served == new, f"still answering with v{served} after 30 s"
        assert set(statuses) == {200}
    finally:  # the registry as other tests expect it: champion back, the added version gone
        project.python(registry + f"c.set_registered_model_alias('{MODEL}', 'champion', '{current}')\n"
                                  f"c.delete_model_version('{MODEL}', '{new}')\n")
