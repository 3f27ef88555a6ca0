"""serving/front.py and the app in memory (FastAPI's TestClient, lifespan included) on a small composed graph
served as a model file: bad bodies get a 4xx that says what is wrong (never a 5xx), every answer carries a
request id, /ready is not /health, /predict's OpenAPI comes from the model's contract, and micro-batching
answers as scoring alone does."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest

from serving.app import create_app
from serving.service import ServiceSettings
from tasks.core.params_spec import ServeParams, TrackingParams
from tasks.core.schema_spec import Feature, Schema
from tests.helpers import linear_raw_graph

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 behind its TestClient; httpx still works
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

SCHEMA = Schema(source="t", target="y", classes=["no", "yes"], features=[
    Feature(name="customer age", kind="numeric", min=18, max=90),
    Feature(name="tenure", kind="numeric", nullable=False),
    Feature(name="plan", kind="categorical", categories=["basic", "premium"], closed_categories=True),
    Feature(name="region", kind="categorical", categories=["north", "south"]),
])
ROW = {"customer age": 40, "tenure": 3.5, "plan": "basic", "region": "north"}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A composed raw-input graph over a linear model of the 4 encoded columns."""
    path = tmp_path_factory.mktemp("model") / "model.onnx"
    onnx.save(linear_raw_graph(np.array([[0.05, -0.05], [0.1, -0.1], [0.3, 0.0], [0.0, 0.2]]), SCHEMA), path)
    return path


def client_for(model_file, **serve) -> TestClient:
    settings = ServiceSettings(serve=ServeParams(request_log="", **serve), model_name="m", tracking=TrackingParams(),
                               model_file=model_file)
    return TestClient(create_app(settings))


@pytest.fixture(scope="module")
def client(model_file):
    with client_for(model_file, max_body_mb=0.01) as client:
        yield client


def test_an_answer_carries_its_request_id_in_body_header_and_row_ids(client):
    response = client.post("/predict", json={"rows": [ROW, ROW]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers["x-request-id"] == body["request_id"] and len(body["request_id"]) == 32
    assert [p["id"] for p in body["predictions"]] == [f"{body['request_id']}-{i}" for i in range(2)]
    for path in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert len(client.get(path).headers["x-request-id"]) == 32, path
    refused = client.post("/predict", content=b"{")
    assert refused.headers["x-request-id"] == refused.json()["request_id"]


@pytest.mark.parametrize("body,status,said", [
    (b'{"rows": [{"customer age": 40', 400, "not valid JSON"),
    (b"\xff", 400, "not valid JSON"),
    (b'{"rows": []}', 422, '{"rows": ['),
    (b'[{"tenure": 1}]', 422, '{"rows": ['),
    (json.dumps({"rows": [{**ROW, "tenure": "3"}]}).encode(), 422, "tenure float_type"),
    (json.dumps({"rows": [{k: v for k, v in ROW.items() if k != "tenure"}]}).encode(), 422, "tenure missing"),
    (json.dumps({"rows": [{**ROW, "tenure": float("nan")}]}).encode(), 422, "tenure finite_number"),
    (json.dumps({"rows": [{**ROW, "customer age": float("inf")}]}).encode(), 422, "customer age finite_number"),
    (json.dumps({"rows": [ROW, {**ROW, "customer age": 1e999}]}).encode(), 422, "customer age finite_number"),
    (json.dumps({"rows": [{**ROW, "plan": "gold"}]}).encode(), 422, "plan literal_error"),
    (json.dumps({"rows": [{**ROW, "customer age": 91}]}).encode(), 422, "customer age less_than_equal"),
])
def test_a_bad_body_gets_a_4xx_that_says_what_is_wrong(client, body, status, said):
    response = client.post("/predict", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    text = detail if isinstance(detail, str) else " ".join(f"{p['field']} {p['rule']}" for p in detail)
    assert said in text, detail


def test_a_body_over_the_limit_gets_413_whether_its_length_is_declared_or_not(client):
    big = json.dumps({"rows": [ROW] * 400}).encode()   # ~30 KB over the 10 KB limit
    assert client.post("/predict", content=big).status_code == 413
    chunked = client.post("/predict", content=(big[i:i + 4096] for i in range(0, len(big), 4096)))
    assert chunked.status_code == 413 and "max_body_mb" in chunked.json()["detail"]
    assert client.post("/predict", json={"rows": [ROW] * 20}).status_code == 200   # under it: served


def test_health_is_the_process_and_ready_is_a_warmed_champion(client):
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
    service = client.app.state.service
    champion, service.router.champion = service.router.champion, None
    try:
        assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 503
        assert client.post("/predict", json={"rows": [ROW]}).status_code == 503
    finally:
        service.router.champion = champion


def test_predict_openapi_is_generated_from_the_contract_and_follows_the_champion(client, model_file):
    operation = client.get("/openapi.json").json()["paths"]["/predict"]["post"]
    row = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]["rows"]["items"]
    assert set(row["properties"]) == set(ROW) and set(row["required"]) == set(ROW)
    age = row["properties"]["customer age"]["anyOf"][0]
    assert (age["minimum"], age["maximum"]) == (18, 90)
    assert row["properties"]["plan"]["anyOf"][0]["enum"] == ["basic", "premium"]
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["properties"]["predictions"]["items"]["properties"]["label"]["enum"] == ["no", "yes"]
    assert {"400", "413", "422", "503"} <= set(operation["responses"])
    service = client.app.state.service
    champion, service.router.champion = service.router.champion, None
    try:   # another champion (here: none) -> another document
        assert "no champion" in client.get("/openapi.json").json()["paths"]["/predict"]["post"]["description"]
    finally:
        service.router.champion = champion


def test_micro_batching_answers_as_scoring_alone(client, model_file):
    rows = [ROW, {**ROW, "customer age": 61, "region": 7}, {**ROW, "plan": " premium "}]
    alone = [p["probabilities"]["yes"] for p in client.post("/predict", json={"rows": rows}).json()["predictions"]]
    with client_for(model_file, batch=True, batch_max_rows=2) as batched:
        answers = [batched.post("/predict", json={"rows": [row]}).json() for row in rows]
    assert [a["predictions"][0]["probabilities"]["yes"] for a in answers] == pytest.approx(alone, abs=1e-7)


def test_the_challenger_share_set_on_one_worker_moves_every_worker(tmp_path):
    from serving.variants import Router, SharedShare

    path = SharedShare.create(tmp_path / "share", 0.1)
    first, second = Router(0.1, shared=SharedShare(path)), Router(0.1, shared=SharedShare(path))
    first.share = 0.75
    assert second.share == 0.75 and Router(0.1).share == 0.1


def test_a_big_body_is_scored_off_the_loop_and_answered_whole(model_file):
    rows = [{**ROW, "customer age": 18 + i % 70} for i in range(1200)]   # ~90 KB: over BIG_BODY_BYTES
    with client_for(model_file) as client:
        response = client.post("/predict", json={"rows": rows})
        single = client.post("/predict", json={"rows": rows[5:6]}).json()["predictions"][0]["probabilities"]
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 1200 and predictions[5]["probabilities"] == pytest.approx(single)


def test_a_feedback_body_over_the_limit_gets_413_whether_its_length_is_declared_or_not(client):
    labels = {"labels": [{"id": f"{'0' * 32}-{i}", "label": "yes"} for i in range(400)]}   # ~20 KB over 10 KB
    big = json.dumps(labels).encode()
    declared = client.post("/feedback", content=big, headers={"content-type": "application/json"})
    chunked = client.post("/feedback", content=(big[i:i + 4096] for i in range(0, len(big), 4096)),
                          headers={"content-type": "application/json"})
    for response in (declared, chunked):
        assert response.status_code == 413 and "serve.max_body_mb" in response.json()["detail"], response.text
        assert response.headers["x-request-id"] == response.json()["request_id"]
    small = client.post("/feedback", json={"labels": labels["labels"][:2]})
    assert small.status_code == 409   # under the limit: read (and refused for its own reason: no request log here)


def test_feedback_needs_the_admin_token_when_the_service_is_not_on_loopback(model_file, monkeypatch):
    body = {"labels": [{"id": "r-0", "label": "yes"}]}
    monkeypatch.delenv("TORCHSHIP_ADMIN_TOKEN", raising=False)
    with client_for(model_file, host="0.0.0.0") as exposed, client_for(model_file) as local:
        assert exposed.post("/feedback", json=body).status_code == 403   # no token configured: closed
        monkeypatch.setenv("TORCHSHIP_ADMIN_TOKEN", "feedback-token-never-guessed")
        assert exposed.post("/feedback", json=body).status_code == 401
        wrong = exposed.post("/feedback", json=body, headers={"authorization": "Bearer guessed"})
        assert wrong.status_code == 401 and "Authorization" in wrong.json()["detail"]
        right = exposed.post("/feedback", json=body, headers={"authorization": "Bearer feedback-token-never-guessed"})
        assert right.status_code == 409   # let in (and refused for its own reason: no request log here)
        assert local.post("/feedback", json=body).status_code == 409   # loopback: no token asked
        assert exposed.get("/health").status_code == 200


def test_a_small_table_body_is_decoded_on_the_event_loop(client, monkeypatch):
    import serving.front

    sent = []
    run = serving.front.run_in_threadpool

    async def counted(work, *args):
        sent.append(work)
        return await run(work, *args)

    monkeypatch.setattr(serving.front, "run_in_threadpool", counted)
    assert client.post("/predict", json={"rows": [ROW] * 3}).status_code == 200
    assert sent == []   # the hot path: no thread hop for a few rows
