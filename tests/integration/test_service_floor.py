"""The real service (`python -m serving` under uvicorn on 127.0.0.1, request log on, admin token set) over the tiny
pipeline's registry: 2,000 requests sent while the champion is swapped all succeed, every row is logged and the
OpenAPI follows the swap; a request without the admin token cannot change the split; a tampered artifact is
refused while the champion keeps serving."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx
import onnx
import pytest

from tasks.core.procs import free_port, http_ok, start_child, wait_until_ready
from tasks.registry.read import CHAMPION, registry_client
from tests.helpers import champion_bytes, holdout_rows, register_by_hand

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"
TOKEN = "floor-token"
POLL_S = 0.2


@pytest.fixture(scope="module")
def served(tiny_pipeline, tmp_path_factory):
    """(project, url, request log, service log, MLflow client) of a running service; stopped by PID afterwards,
    and the registry put back as it was (aliases, no added versions)."""
    project, _ = tiny_pipeline
    folder = tmp_path_factory.mktemp("floor")
    port, request_log = free_port(), folder / "requests.jsonl"
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                    "--request-log", str(request_log), "--poll-seconds", str(POLL_S)],
                        folder / "service.log", cwd=project.root,
                        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
                             "TORCHSHIP_ADMIN_TOKEN": TOKEN})
    client = registry_client_of(project)
    before = client.get_model_version_by_alias(MODEL, CHAMPION).version
    versions = {v.version for v in client.search_model_versions(f"name='{MODEL}'")}
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(child, http_ok(f"{url}/ready"), timeout=90)
        yield project, url, request_log, child, client
    finally:
        child.stop()
        client.set_registered_model_alias(MODEL, CHAMPION, before)
        for added in {v.version for v in client.search_model_versions(f"name='{MODEL}'")} - versions:
            client.delete_model_version(MODEL, added)
    assert "Traceback" not in child.output_tail(50_000), child.output_tail()


def registry_client_of(project):
    from tasks.core.params_spec import TrackingParams

    return registry_client(TrackingParams(uri=f"sqlite:///{project.root / 'mlflow' / 'mlflow.db'}"))


def serving_version(url: str) -> str:
    return httpx.get(f"{url}/health").json()["champion"]


def wait_for_version(url: str, version: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while serving_version(url) != version:
        assert time.monotonic() < deadline, f"the service still serves v{serving_version(url)}, not v{version}"
        time.sleep(POLL_S / 2)


def test_2000_requests_sent_during_a_hot_swap_all_succeed_and_are_logged(served):
    project, url, request_log, _, client = served
    before = serving_version(url)
    new = register_by_hand(project, MODEL, champion_bytes(MODEL), alias=None)   # the champion's bytes, tagged
    row = holdout_rows(project)[0]
    answers: list[tuple[int, str | None, str | None]] = []
    lock, swapped = threading.Lock(), threading.Event()

    def send(count: int) -> None:
        with httpx.Client(base_url=url, timeout=10) as http:
            for _ in range(count):
                response = http.post("/predict", json={"rows": [row]})
                ok = response.status_code == 200
                with lock:
                    answers.append((response.status_code, response.json()["version"] if ok else response.text,
                                    response.json()["predictions"][0]["id"] if ok else None))
                    swap = len(answers) >= 600 and not swapped.is_set()   # a third of the way: move the alias
                    if swap:
                        swapped.set()
                if swap:
                    client.set_registered_model_alias(MODEL, CHAMPION, new)

    threads = [threading.Thread(target=send, args=(500,)) for _ in range(4)]
    for thread in threads:   # the champion stays `new`: the same bytes, other tests read the version they find
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 2000 and {status for status, _, _ in answers} == {200}, \
        [a for a in answers if a[0] != 200][:3]
    served_by = [version for _, version, _ in answers]
    assert served_by[0] == before and served_by[-1] == new, "the swap did not happen during the load"
    assert set(served_by) == {before, new}
    described = httpx.get(f"{url}/openapi.json").json()["paths"]["/predict"]["post"]   # follows the swap too
    assert f"(champion v{new})" in described["description"]
    row_schema = described["requestBody"]["content"]["application/json"]["schema"]["properties"]["rows"]["items"]
    assert set(row_schema["properties"]) == set(row)
    deadline = time.monotonic() + 10
    ids = {row_id for _, _, row_id in answers}
    while time.monotonic() < deadline:   # the log is written every serve.log_flush_seconds
        logged = {json.loads(line)["id"] for line in request_log.read_text().splitlines()} if request_log.exists() \
            else set()
        if ids <= logged:
            break
        time.sleep(0.2)
    assert ids <= logged, f"{len(ids - logged)} served rows are not in the request log"


def test_a_request_without_the_admin_token_cannot_change_the_split(served):
    _, url, _, _, _ = served
    share = httpx.get(f"{url}/health").json()["challenger_share"]
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer wrong"}, {"X-Admin-Token": TOKEN},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}):
        refused = httpx.post(f"{url}/admin/share", params={"share": 0.9}, headers=headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["x-request-id"]
    assert httpx.get(f"{url}/health").json()["challenger_share"] == share
    allowed = httpx.post(f"{url}/admin/share", params={"share": 0.25}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert allowed.status_code == 200 and allowed.json()["challenger_share"] == 0.25
    httpx.post(f"{url}/admin/share", params={"share": share}, headers={"Authorization": f"Bearer {TOKEN}"})


def test_a_tampered_artifact_is_refused_while_the_champion_keeps_serving(served):
    project, url, _, child, client = served
    current = serving_version(url)
    new = register_by_hand(project, MODEL, champion_bytes(MODEL), alias=None)
    # After registration, someone rewrites the stored model: still a valid graph, different bytes.
    stored = Path(client.get_model_version_download_uri(MODEL, new).removeprefix("file://")) / "model.onnx"
    model = onnx.load(stored)
    model.doc_string = "changed after registration"
    onnx.save(model, stored)
    client.set_registered_model_alias(MODEL, CHAMPION, new)
    try:
        row = holdout_rows(project)[0]
        deadline = time.monotonic() + 10 * POLL_S + 5
        refusal = f"could not load champion v{new} (v{current} keeps serving)"
        while refusal not in child.output_tail(50_000) and time.monotonic() < deadline:
            response = httpx.post(f"{url}/predict", json={"rows": [row]})
            assert response.status_code == 200 and response.json()["version"] == current
            time.sleep(POLL_S / 2)
        said = child.output_tail(50_000)
        assert refusal in said and "sha256" in said, said[-2000:]
        assert serving_version(url) == current
        assert httpx.post(f"{url}/predict", json={"rows": [row]}).json()["version"] == current
    finally:   # the champion the other tests expect
        client.set_registered_model_alias(MODEL, CHAMPION, current)


def test_workers_share_the_split_and_one_request_log(served, tmp_path):
    """serve.workers 2: one parent, two worker processes; /admin/share answered by either moves both; rows served by
    both land in the one request log."""
    import psutil

    project, _, _, _, _ = served
    port, request_log = free_port(), tmp_path / "requests.jsonl"
    child = start_child("service", [sys.executable, "-m", "serving", "--port", str(port), "--model-name", MODEL,
                                    "--request-log", str(request_log), "--workers", "2"], tmp_path / "service.log",
                        cwd=project.root, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                                               "TORCHSHIP_ADMIN_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(child, http_ok(f"{url}/ready"), timeout=90)
        workers = psutil.Process(child.process.pid).children(recursive=True)
        assert len([p for p in workers if "python" in p.name()]) >= 2, workers
        row = holdout_rows(project)[0]
        ids = {httpx.post(f"{url}/predict", json={"rows": [row]}).json()["predictions"][0]["id"] for _ in range(100)}
        assert httpx.post(f"{url}/admin/share", params={"share": 0.4},
                          headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        shares = {httpx.get(f"{url}/health").json()["challenger_share"] for _ in range(20)}   # a connection each
        assert shares == {0.4}
    finally:
        child.stop()
    logged = [json.loads(line)["id"] for line in request_log.read_text().splitlines()]
    assert sorted(logged) == sorted(ids)
