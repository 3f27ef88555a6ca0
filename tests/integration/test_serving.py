"""The real service on 127.0.0.1: predictions, schema errors, admin token, metrics, and following a
promotion done by hand in the registry without a failed request."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
TOKEN = "test-token"


@pytest.fixture(scope="module")
def service(tiny_pipeline):
    project, _ = tiny_pipeline
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "TORCHSHIP_ADMIN_TOKEN": TOKEN, "MLFLOW_DISABLE_TELEMETRY": "true"}
    process = subprocess.Popen([sys.executable, "-m", "serving", "--port", str(port), "--poll-seconds", "0.5"],
                               cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            if httpx.get(f"{url}/health", timeout=1).json().get("champion"):
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        pytest.fail("service did not come up within 60 s")
    yield project, url
    process.terminate()
    process.wait(timeout=15)


def _row(project) -> dict:
    rows = pd.read_parquet(project.root / "data" / "prepare" / "holdout.parquet").drop(columns=["churned"]).head(1)
    return {k: (None if pd.isna(v) else v) for k, v in rows.iloc[0].to_dict().items()}


def test_predict_returns_labels_and_probabilities(service):
    project, url = service
    response = httpx.post(f"{url}/predict", json={"rows": [_row(project)]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == "champion"
    prediction = body["predictions"][0]
    assert prediction["label"] in {"yes", "no"}
    assert abs(sum(prediction["probabilities"].values()) - 1) < 1e-5


def test_bad_request_names_field_and_rule(service):
    project, url = service
    row = _row(project)
    del row["tenure_months"]
    row["plan"] = 3.5
    response = httpx.post(f"{url}/predict", json={"rows": [row]})
    assert response.status_code == 422
    fields = {(p["field"], p["rule"]) for p in response.json()["detail"]}
    assert ("tenure_months", "missing") in fields
    assert any(field == "plan" for field, _ in fields)


def test_admin_needs_the_token(service):
    _, url = service
    assert httpx.post(f"{url}/admin/reload").status_code == 401
    assert httpx.post(f"{url}/admin/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{url}/admin/reload", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_metrics_count_requests(service):
    project, url = service
    httpx.post(f"{url}/predict", json={"rows": [_row(project)]})
    text = httpx.get(f"{url}/metrics").text
    served = [line for line in text.splitlines() if line.startswith("torchship_requests_total{")]
    assert any('variant="champion"' in line and 'status="ok"' in line and float(line.split()[-1]) >= 1
               for line in served), text
    assert "torchship_model_version" in text


def _register_as_champion(project, onnx_path_code: str) -> str:
    """Register an ONNX file as a new version and move `champion` to it, as a reviewer would in the UI."""
    return project.python(
        "import mlflow, onnx\nfrom mlflow import MlflowClient\n"
        "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\nc = MlflowClient()\n"
        f"path = {onnx_path_code}\n"
        f"info = mlflow.onnx.log_model(onnx.load(path), name='model', registered_model_name='{MODEL}')\n"
        f"c.set_registered_model_alias('{MODEL}', 'champion', info.registered_model_version)\n"
        "print(info.registered_model_version)\n").strip().splitlines()[-1]


def _restore_champion(project, version: str) -> None:
    project.python("import mlflow\nfrom mlflow import MlflowClient\nmlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\n"
                   f"MlflowClient().set_registered_model_alias('{MODEL}', 'champion', '{version}')\n")


def _until_served(url: str, row: dict, version: str) -> list[int]:
    """Requests until the service answers with `version` (bounded: 30 s); returns every status seen."""
    statuses, served = [], None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = httpx.post(f"{url}/predict", json={"rows": [row]})
        statuses.append(response.status_code)
        served = response.json().get("version")
        if served == version:
            break
    assert served == version, f"service still answers with v{served} after 30 s"
    return statuses


def test_promotion_by_hand_is_followed_without_failed_requests(service):
    project, url = service
    current = httpx.get(f"{url}/health").json()["champion"]
    # The champion's bytes again as a new version, promoted by hand.
    new = _register_as_champion(project, f"mlflow.artifacts.download_artifacts('models:/{MODEL}@champion') + '/model.onnx'")
    assert new != current
    try:
        assert set(_until_served(url, _row(project), new)) == {200}
    finally:
        _restore_champion(project, current)  # other tests see the state they expect


def test_served_variant_agrees_with_the_training_time_eager_model_on_raw_rows(service):
    """The preprocessing travels inside the served graph: raw JSON rows (missing values and an unseen
    category included) score as the eager PyTorch model that the variant came from scores them."""
    import json

    import numpy as np
    import torch

    from tasks.contract import encode_features, load_schema
    from tasks.training.weights import load_trained

    project, url = service
    frame = pd.read_parquet(project.root / "data/prepare/holdout.parquet").drop(columns=["churned"]).head(40)
    rows = [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]
    rows[0] = {k: None for k in rows[0]}
    rows[1]["plan"] = "a-plan-never-seen-in-training"
    # Serve exactly the workspace's selected variant (other tests may have left another champion).
    profile = json.loads((project.root / "data/profile/report.json").read_text())
    current = httpx.get(f"{url}/health").json()["champion"]
    version = _register_as_champion(project, repr(profile["selected_path"]))
    try:
        _until_served(url, rows[2], version)
        response = httpx.post(f"{url}/predict", json={"rows": rows})
    finally:
        _restore_champion(project, current)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == version
    weights = "data/compress/student/model.pt" if profile["selected"].startswith("student") else "data/train/model.pt"
    model, saved = load_trained(project.root / weights)
    schema = load_schema(project.root / "data/prepare/schema.json")
    with torch.no_grad():
        eager = torch.softmax(model(torch.from_numpy(encode_features(pd.DataFrame(rows), schema))), 1).numpy()
    served = np.array([[p["probabilities"][label] for label in saved["classes"]]
                       for p in response.json()["predictions"]])
    tolerance = 0.05 if "int8" in profile["selected"] else 1e-4  # int8 rounds weights and activations
    np.testing.assert_allclose(served, eager, atol=tolerance)
    if "int8" not in profile["selected"]:
        assert [p["label"] for p in response.json()["predictions"]] == [saved["classes"][i] for i in eager.argmax(1)]
