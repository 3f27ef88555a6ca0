"""A registered version is self-contained: `mlflow models serve` of it (a real process on 127.0.0.1) takes raw
JSON rows (a missing number, a missing and an unseen category, whitespace around and inside categories) and
answers as torchship's own service does; so do MLflow's pyfunc and ONNX Runtime on the same file."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tasks.core.procs import free_port, http_ok, running, start_child, wait_until_ready
from tests.helpers import holdout_rows

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
BIN = Path(sys.executable).parent


def registry(project):
    """An MLflow client on the project's store (by absolute URI; no process-wide MLflow state is touched)."""
    from mlflow import MlflowClient

    store = f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"
    return MlflowClient(tracking_uri=store, registry_uri=store)


def raw_rows(project) -> list[dict]:
    rows = holdout_rows(project, 6)
    rows[0]["customer age"] = None
    rows[1]["plan"] = "a-plan-never-seen-in-training"
    rows[2]["payment method"] = "  bank  transfer\t"
    rows[3]["region"] = None
    rows[4]["contract"] = "\u00a0monthly "
    return rows


@pytest.fixture(scope="module")
def servers(tiny_pipeline, tmp_path_factory):
    """(project, version, rows, mlflow serve URL, torchship service URL): both started at once, both answering
    for the champion; stopped by PID (their process groups) on every way out."""
    project, _ = tiny_pipeline
    client = registry(project)
    version = str(client.get_model_version_by_alias(MODEL, "champion").version)
    logs = tmp_path_factory.mktemp("mlflow-serve")
    ports = free_port(), free_port()
    mlflow_serve = start_child("mlflow models serve", [
        str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{MODEL}/{version}", "--env-manager", "local",
        "--host", "127.0.0.1", "--port", str(ports[0])], logs / "mlflow.log", cwd=project.root,
        env={**project.env(), "MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"})
    service = start_child("service", [
        sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(ports[1]), "--model-name", MODEL,
        "--challenger-share", "0", "--request-log", "", "--seed", "0"], logs / "service.log", cwd=project.root,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"})
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    with running([mlflow_serve, service]):
        wait_until_ready(mlflow_serve, http_ok(f"{urls[0]}/ping"), timeout=90)
        wait_until_ready(service, http_ok(f"{urls[1]}/health", lambda body: body.get("champion") == version),
                         timeout=90)
        yield project, version, raw_rows(project), *urls


@pytest.fixture(scope="module")
def torchship_answer(servers) -> np.ndarray:
    """Probabilities (N, C) from torchship's service, in the model's class order."""
    project, version, rows, _, service_url = servers
    response = httpx.post(f"{service_url}/predict", json={"rows": rows}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == version
    classes = json.loads((project.root / "data/prepare/schema.json").read_text())["classes"]
    return np.array([[p["probabilities"][label] for label in classes] for p in response.json()["predictions"]])


def mlflow_probabilities(body: dict, rows: int) -> np.ndarray:
    """MLflow's pyfunc flattens each (N, C) output to N*C values (row-major): one record per value."""
    return np.array([record["probabilities"] for record in body["predictions"]]).reshape(rows, -1)


@pytest.mark.parametrize("orient", ["dataframe_records", "dataframe_split"])
def test_mlflow_serve_takes_raw_json_rows_and_answers_as_torchship_does(servers, torchship_answer, orient):
    _, _, rows, mlflow_url, _ = servers
    columns = list(rows[0])
    payload = rows if orient == "dataframe_records" else {"columns": columns,
                                                          "data": [[row[c] for c in columns] for row in rows]}
    response = httpx.post(f"{mlflow_url}/invocations", json={orient: payload}, timeout=30)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(mlflow_probabilities(response.json(), len(rows)), torchship_answer, atol=1e-5)


def test_pyfunc_and_onnx_runtime_answer_as_torchship_does(servers, torchship_answer):
    project, version, rows, _, _ = servers
    out = project.python(
        "import json, mlflow, numpy as np, onnxruntime as ort, pandas as pd\n"
        "mlflow.set_tracking_uri('sqlite:///mlflow/mlflow.db')\n"
        f"rows, uri = pd.DataFrame({rows!r}), 'models:/{MODEL}/{version}'\n"
        "pyfunc = mlflow.pyfunc.load_model(uri).predict(rows)['probabilities'].to_numpy()\n"
        "path = mlflow.artifacts.download_artifacts(uri) + '/model.onnx'\n"
        "session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])\n"
        "feed = {i.name: rows[i.name].to_numpy(np.float64 if i.type == 'tensor(double)' else object)\n"
        "        for i in session.get_inputs()}\n"
        "direct = session.run(['probabilities'], feed)[0]\n"
        "print(json.dumps({'pyfunc': pyfunc.tolist(), 'onnxruntime': direct.tolist()}))\n")
    answers = json.loads(out.strip().splitlines()[-1])
    np.testing.assert_allclose(np.reshape(answers["pyfunc"], (len(rows), -1)), torchship_answer, atol=1e-5)
    np.testing.assert_allclose(answers["onnxruntime"], torchship_answer, atol=1e-5)


def test_profile_writes_the_gated_raw_graph_and_that_is_what_is_registered(servers):
    project, version, _, _, _ = servers
    profile = json.loads((project.root / "data/profile/report.json").read_text())
    raw = profile["raw_model"]
    assert profile["selected_path"] == raw["path"] == "data/profile/model.onnx"
    assert raw["variant"] == profile["selected"] and raw["gate"]["status"] == "pass", raw
    assert registry(project).get_model_version(MODEL, version).tags["artifact_sha256"] == raw["sha256"]


def test_the_version_names_what_loading_it_needs_pinned_to_this_environment(servers):
    """register names the requirements (MLflow would otherwise infer them in a fresh interpreter): each package the
    onnx flavor loads with, at the version installed here, as `mlflow models serve --env-manager virtualenv` and
    `mlflow models build-docker` would install them."""
    from importlib.metadata import version as installed
    from urllib.parse import urlparse

    project, version, *_ = servers
    client = registry(project)
    model_id = client.get_model_version(MODEL, version).source.removeprefix("models:/")   # a logged model's id
    folder = urlparse(client.get_logged_model(model_id).artifact_location).path   # a file: URI on this store
    listed = Path(folder, "requirements.txt").read_text().split()
    assert sorted(listed) == sorted(f"{p}=={installed(p)}" for p in ("mlflow", "numpy", "onnx", "onnxruntime",
                                                                          "pandas")), listed
