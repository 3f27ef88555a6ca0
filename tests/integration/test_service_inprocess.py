"""The service in-process (FastAPI's TestClient, lifespan included) over the tiny pipeline's real MLflow
registry: predictions and their ids, schema errors, admin token, metrics, the buffered request log and
feedback labels, routing and shadow scoring (to the shadow log), hot swaps after a promotion by another process,
a broken new version, and parity with the eager model."""
from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.app import create_app
from serving.service import ServiceSettings
from tasks.config import default_params
from tasks.core.env import TOKEN_ENV
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.runtime import decide, decision_threshold
from tasks.core.servelog import feedback_path, shadow_path
from tasks.registry.read import CHALLENGER, CHAMPION, aliases, registry_client, verified_onnx
from tests.helpers import champion_bytes, holdout_rows, promote_by_hand

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 behind its TestClient; httpx still works
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
TOKEN = "test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def settings(project, request_log="", share: float = 0.0, model_name: str = MODEL, **options) -> ServiceSettings:
    """The project's registry (by absolute URI: the tests run from elsewhere), a fast poll, no request log
    unless given; a log is written only by an explicit flush or at shutdown (so a test knows when)."""
    tracking = TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}")
    serve = ServeParams(poll_seconds=0.2, request_log=str(request_log), challenger_share=share, log_flush_seconds=60)
    return ServiceSettings(serve=serve, model_name=model_name, tracking=tracking, **options)


@pytest.fixture(scope="module")
def service(tiny_pipeline, tmp_path_factory):
    """(project, client, request log path) over one app for the module; the admin token is set."""
    project, _ = tiny_pipeline
    request_log = tmp_path_factory.mktemp("serve") / "requests.jsonl"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TOKEN_ENV, TOKEN)
        env.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        with TestClient(create_app(settings(project, request_log))) as client:
            assert client.get("/health").json()["champion"], "the tiny pipeline registered no champion"
            yield project, client, request_log


@pytest.fixture
def registry(service):
    """An MLflow client on the project's registry; whatever a test moves or adds there is put back after
    it (aliases restored, added versions deleted) and the module's service reloads."""
    project, client, _ = service
    registry = registry_client(settings(project).tracking)
    before = aliases(registry, MODEL)
    versions = {v.version for v in registry.search_model_versions(f"name='{MODEL}'")}
    try:
        yield registry
    finally:
        for alias in (CHAMPION, CHALLENGER):
            if alias in before:
                registry.set_registered_model_alias(MODEL, alias, before[alias])
            elif alias in aliases(registry, MODEL):
                registry.delete_registered_model_alias(MODEL, alias)
        for added in {v.version for v in registry.search_model_versions(f"name='{MODEL}'")} - versions:
            registry.delete_model_version(MODEL, added)
        client.post("/admin/reload", headers=ADMIN)


CHAMPION_BYTES = champion_bytes(MODEL)


def test_the_canary_flags_override_the_serve_params_and_bad_ones_are_refused():
    from serving.__main__ import parse_args, serve_params

    params = default_params()
    canary = ["--host", "127.0.0.1", "--port", "8123", "--model-name", "m", "--challenger-share", "0.25",
              "--request-log", "", "--seed", "0"]
    args = parse_args(params, canary)
    assert serve_params(params.serve, args) == params.serve.model_copy(
        update={"port": 8123, "challenger_share": 0.25, "request_log": ""})
    assert (args.model_name, args.seed) == ("m", 0)
    with pytest.raises(SystemExit, match="challenger_share"):
        serve_params(params.serve, parse_args(params, ["--challenger-share", "1.5"]))


def served_threshold(project, version: str) -> float | None:
    """A version's binary decision threshold, from its graph's metadata (None: it answers the argmax)."""
    import onnx

    client = registry_client(TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"))
    graph = onnx.load_from_string(verified_onnx(client, MODEL, version))
    return decision_threshold({prop.key: prop.value for prop in graph.metadata_props})


def test_predict_returns_labels_and_probabilities(service):
    project, client, _ = service
    response = client.post("/predict", json={"rows": holdout_rows(project, 3)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == "champion" and body["version"] == client.get("/health").json()["champion"]
    assert body["served_ms"] > 0 and len(body["predictions"]) == 3
    assert len(body["request_id"]) == 32 and int(body["request_id"], 16) >= 0   # a uuid4 in hex
    assert [p["id"] for p in body["predictions"]] == [f"{body['request_id']}-{i}" for i in range(3)]
    assert client.post("/predict", json={"rows": holdout_rows(project)}).json()["request_id"] != body["request_id"]
    threshold = served_threshold(project, body["version"])   # None: the argmax
    for prediction in body["predictions"]:
        assert prediction["label"] in {"yes", "no"}
        assert abs(sum(prediction["probabilities"].values()) - 1) < 1e-5
        probabilities = np.array([list(prediction["probabilities"].values())], dtype=np.float32)
        assert prediction["label"] == list(prediction["probabilities"])[decide(probabilities, threshold)[0]]


def test_bad_rows_get_422_naming_row_field_and_rule(service):
    project, client, _ = service
    good, bad = holdout_rows(project, 2)
    del bad["tenure_months"]
    bad["plan"] = 3.5
    response = client.post("/predict", json={"rows": [good, bad]})
    assert response.status_code == 422
    problems = {(p["row"], p["field"], p["rule"]) for p in response.json()["detail"]}
    assert (1, "tenure_months", "missing") in problems
    assert any(row == 1 and field == "plan" for row, field, _ in problems)
    assert not any(row == 0 for row, _, _ in problems)
    assert client.post("/predict", json={"rows": []}).status_code == 422
    assert client.post("/predict", json=[good]).status_code == 422


def test_admin_endpoints_need_the_token(service, monkeypatch):
    _, client, _ = service
    assert client.post("/admin/reload").status_code == 401
    assert client.post("/admin/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200
    assert client.post("/admin/share", params={"share": 1.5}, headers=ADMIN).status_code == 422
    assert client.post("/admin/share", params={"share": 0.0}, headers=ADMIN).json()["challenger_share"] == 0.0
    monkeypatch.delenv(TOKEN_ENV)
    assert client.post("/admin/reload", headers=ADMIN).status_code == 403


def requests_counted(client, status: str) -> float:
    """torchship_requests_total summed over variants and versions for one status."""
    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(sample.value for family in families if family.name == "torchship_requests"
               for sample in family.samples if sample.name.endswith("_total") and sample.labels["status"] == status)


def test_metrics_count_requests(service):
    project, client, _ = service
    ok, invalid = requests_counted(client, "ok"), requests_counted(client, "invalid")
    client.post("/predict", json={"rows": holdout_rows(project)})
    client.post("/predict", json={"rows": [{"plan": 3.5}]})
    assert (requests_counted(client, "ok"), requests_counted(client, "invalid")) == (ok + 1, invalid + 1)
    text = client.get("/metrics").text
    assert 'torchship_model_version{alias="champion"}' in text and "torchship_request_seconds_bucket" in text


def test_each_served_row_is_logged_with_its_id_by_the_time_the_service_stops(service, tmp_path):
    project, _, _ = service
    request_log, rows = tmp_path / "requests.jsonl", holdout_rows(project, 3)
    with TestClient(create_app(settings(project, request_log))) as client:
        answer = client.post("/predict", json={"rows": rows}).json()
        assert request_log.read_text() == ""   # buffered: the request did not wait on the disk
    logged = [json.loads(line) for line in request_log.read_text().splitlines()]
    assert [entry["id"] for entry in logged] == [p["id"] for p in answer["predictions"]]
    assert [entry["features"] for entry in logged] == rows
    assert [entry["prediction"] for entry in logged] == [p["label"] for p in answer["predictions"]]
    for entry, prediction in zip(logged, answer["predictions"]):
        assert entry["probabilities"] == pytest.approx(prediction["probabilities"], abs=1e-6)
    assert {(entry["request_id"], entry["variant"], entry["version"]) for entry in logged} == {
        (answer["request_id"], "champion", answer["version"])}


def test_feedback_labels_served_rows_and_is_written_by_the_time_the_service_stops(service, tmp_path):
    project, _, _ = service
    request_log = tmp_path / "requests.jsonl"
    with TestClient(create_app(settings(project, request_log))) as client:
        served = client.post("/predict", json={"rows": holdout_rows(project, 2)}).json()["predictions"]
        labels = [{"id": served[0]["id"], "label": "yes"}, {"id": served[1]["id"], "label": "no"}]
        response = client.post("/feedback", json={"labels": labels})
        assert response.status_code == 200 and response.json() == {"accepted": 2}
    feedback = [json.loads(line) for line in feedback_path(request_log).read_text().splitlines()]
    assert [{"id": entry["id"], "label": entry["label"]} for entry in feedback] == labels
    assert all(isinstance(entry["ts"], float) for entry in feedback)


def test_feedback_with_any_bad_item_is_refused_whole_naming_item_field_and_rule(service):
    project, client, request_log = service
    served = client.post("/predict", json={"rows": holdout_rows(project)}).json()["predictions"][0]["id"]
    labels = [{"id": served, "label": "yes"}, {"id": served, "label": "maybe"}, {"id": "", "label": "no", "at": 1},
              "yes"]
    response = client.post("/feedback", json={"labels": labels})
    assert response.status_code == 422
    problems = {(p["item"], p["field"], p["rule"]): p["message"] for p in response.json()["detail"]}
    assert set(problems) == {(1, "label", "literal_error"), (2, "id", "string_too_short"),
                             (2, "at", "extra_forbidden"), (3, "(item)", "model_type")}
    assert "'no'" in problems[1, "label", "literal_error"] and "'yes'" in problems[1, "label", "literal_error"]
    client.app.state.service.feedback_log.flush()
    assert served not in feedback_path(request_log).read_text()   # not even the good item was kept


def test_a_malformed_feedback_body_gets_422_naming_the_shape(service):
    _, client, _ = service
    for body in ({}, {"labels": []}, {"labels": {"id": "x", "label": "yes"}}, [{"id": "x", "label": "yes"}]):
        response = client.post("/feedback", json=body)
        assert response.status_code == 422 and '{"labels": [{"id":' in response.json()["detail"], body


def test_no_champion_answers_503_and_health_says_so(service, tmp_path):
    project, _, _ = service
    with TestClient(create_app(settings(project, model_name="no-such-model"))) as client:
        assert client.get("/health").json()["status"] == "no-model"
        assert client.post("/predict", json={"rows": holdout_rows(project)}).status_code == 503
        off = client.post("/feedback", json={"labels": [{"id": "x-0", "label": "yes"}]})
        assert off.status_code == 409 and "serve.request_log is empty" in off.json()["detail"]
    with TestClient(create_app(settings(project, tmp_path / "requests.jsonl", model_name="no-such-model"))) as client:
        assert client.post("/feedback", json={"labels": [{"id": "x-0", "label": "yes"}]}).status_code == 503


def test_share_routes_to_the_challenger_and_the_other_variant_shadows_it_in_the_shadow_log(service, registry, tmp_path):
    project, _, _ = service
    registry.set_registered_model_alias(MODEL, CHALLENGER, aliases(registry, MODEL)[CHAMPION])
    row, request_log = holdout_rows(project), tmp_path / "requests.jsonl"
    with TestClient(create_app(settings(project, request_log, share=0.5, seed=0))) as client:
        assert client.post("/admin/share", params={"share": 0.5, "shadow": "true"}, headers=ADMIN).status_code == 200
        answers = [client.post("/predict", json={"rows": row}).json() for _ in range(20)]
        assert {a["variant"] for a in answers} == {CHAMPION, CHALLENGER}
        assert all("shadow" not in a for a in answers)   # a shadow answer is logged, never returned
        client.post("/admin/share", params={"share": 0.0, "shadow": "false"}, headers=ADMIN)
        assert {client.post("/predict", json={"rows": row}).json()["variant"] for _ in range(10)} == {CHAMPION}
    shadows = {line["id"]: line for line in map(json.loads, shadow_path(request_log).read_text().splitlines())}
    assert len(shadows) == len(answers)   # every shadowed answer, and none once the shadow was switched off
    for answer in answers:   # the other variant scored the same bytes under the answered row's id
        prediction = answer["predictions"][0]
        assert {answer["variant"], shadows[prediction["id"]]["variant"]} == {CHAMPION, CHALLENGER}
        assert shadows[prediction["id"]]["prediction"] == prediction["label"]


def serve_until(client, row: dict, version: str, timeout: float = 30.0) -> list[int]:
    """Requests until the service answers with `version` (bounded); returns every status seen."""
    statuses, served, deadline = [], None, time.monotonic() + timeout
    while served != version and time.monotonic() < deadline:
        response = client.post("/predict", json={"rows": [row]})
        statuses.append(response.status_code)
        served = response.json().get("version")
    assert served == version, f"still answering with v{served} after {timeout:.0f} s"
    return statuses


def test_a_promotion_by_another_process_is_followed_without_failed_requests(service, registry):
    project, client, _ = service
    current = client.get("/health").json()["champion"]
    new = promote_by_hand(project, MODEL, CHAMPION_BYTES)   # the champion's bytes again, as a new version
    assert new != current
    assert set(serve_until(client, holdout_rows(project)[0], new)) == {200}


def test_a_broken_new_version_is_logged_and_the_current_one_keeps_serving(service, registry, caplog):
    project, client, _ = service
    current = client.get("/health").json()["champion"]
    # A valid ONNX graph that torchship did not export: it carries no schema, so it cannot serve.
    broken = promote_by_hand(project, MODEL, "onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("
                             "'Identity', ['x'], ['y'])], 'g', [onnx.helper.make_tensor_value_info('x', 1, [1])], "
                             "[onnx.helper.make_tensor_value_info('y', 1, [1])]))")
    assert client.post("/admin/reload", headers=ADMIN).json()["champion"] == current
    answer = client.post("/predict", json={"rows": holdout_rows(project)})
    assert answer.status_code == 200 and answer.json()["version"] == current
    assert any(f"could not load champion v{broken}" in record.getMessage() for record in caplog.records)


def test_served_variant_agrees_with_the_training_time_eager_model_on_raw_rows(service, registry):
    """The preprocessing travels inside the served graph: raw JSON rows (missing values and an unseen
    category included) score as the eager PyTorch model that the variant came from scores them."""
    import torch

    from tasks.core.schema_spec import load_schema
    from tasks.modalities.table.encoding import encode_features
    from tasks.training.weights import load_trained

    project, client, _ = service
    rows = holdout_rows(project, 40)
    rows[0] = {k: None for k in rows[0]}
    rows[1]["plan"] = "a-plan-never-seen-in-training"
    # Serve exactly the workspace's selected variant (the champion may be another one).
    profile = json.loads((project.root / "data/profile/report.json").read_text())
    version = promote_by_hand(project, MODEL, f"onnx.load({str(project.root / profile['selected_path'])!r})")
    assert client.post("/admin/reload", headers=ADMIN).json()["champion"] == version
    response = client.post("/predict", json={"rows": rows})
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
    if "int8" not in profile["selected"]:   # the served rule: the argmax, or the threshold training fitted
        decided = decide(eager.astype(np.float32), saved.get("threshold"))
        assert [p["label"] for p in response.json()["predictions"]] == [saved["classes"][i] for i in decided]
