"""The closed loop on Prefect's own machinery: real traffic through a real service, the real monitor on its
log, the drift event, the `retrain` deployment (from prefect.yaml, via `torchship deploy`) run by a process
worker, and a new registry version whose lineage names the window's data snapshot. Also: the workspace's
one-writer rule (a Prefect concurrency limit) drops a retrain and refuses a pipeline run while it is held."""
from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from tasks.core.procs import running, start_child
from tasks.monitoring.guards import read_decisions
from tests.conftest import BIN
from tests.helpers import lighten_params, workspace_restored

MODEL = "synthetic-churn"
TRAFFIC = """
from tasks.config import load_params
from tasks.ops.demo import DemoTraffic, running_demo_service
params = load_params()
with running_demo_service(params) as url:
    traffic = DemoTraffic(url, params)
    print(traffic.send({rows}, drift={drift}, seed={seed}))
    print(traffic.send_feedback())
    traffic.wait_logged()
"""


def project_env(project, api: str) -> dict[str, str]:
    """The project's environment on the session's server, with a worker that polls every second."""
    return {**project.env(), "PREFECT_API_URL": api, "PREFECT_HOME": str(project.root / ".prefect"),
            "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}


def deployment_runs(api: str, deployment: str) -> list[dict]:
    with httpx.Client(base_url=api, timeout=10) as client:
        found = client.get(f"/deployments/name/{deployment}")
        if found.status_code != 200:
            return []
        runs = client.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [found.json()["id"]]}}})
        return runs.json()


def wait_for_final_run(api: str, deployment: str, timeout: float) -> dict:
    """Bounded: the deployment's first flow run once it is in a final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = deployment_runs(api, deployment)
        if runs and runs[0]["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return runs[0]
        time.sleep(1)
    raise AssertionError(f"no final run of {deployment} within {timeout:.0f}s: {deployment_runs(api, deployment)}")


def test_drift_event_runs_the_retrain_deployment_on_a_process_worker(tiny_pipeline, prefect_server, tmp_path):
    project, _ = tiny_pipeline
    api = prefect_server.api_url()
    with workspace_restored(project, MODEL):
        lighten_params(project)   # the retrain is a whole pipeline run: without the parts the first run proved
        project.python(TRAFFIC.format(rows=600, drift=0.6, seed=7))
        deployed = project.torchship("deploy")
        assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
        assert "prefect worker start --pool torchship-process" in deployed.stdout
        # the approval form the Prefect UI renders from the deployed `review` flow's parameters
        with httpx.Client(base_url=api, timeout=10) as client:
            form = client.get("/deployments/name/torchship-review/review").json()["parameter_openapi_schema"]
        assert form["properties"]["decision"]["enum"] == ["approve", "reject"] and "reviewer" in form["required"]
        worker = start_child("prefect worker", [str(BIN / "prefect"), "worker", "start", "--pool", "torchship-process"],
                             tmp_path / "worker.log", env=project_env(project, api), cwd=project.root)
        with running([worker]):
            monitored = project.torchship("monitor")
            assert monitored.returncode == 0, monitored.stdout[-3000:] + monitored.stderr[-3000:]
            assert "trigger fired" in monitored.stdout and "event" in monitored.stdout, monitored.stdout[-3000:]
            run = wait_for_final_run(api, "torchship-retrain/retrain", timeout=400)
            assert run["state_type"] == "COMPLETED", worker.output_tail(6000)
        decisions = read_decisions(project.root / "data/monitor/decisions.jsonl")
        assert [d.outcome for d in decisions] == ["fired", "retrained"], decisions
        [batch] = [p.name for p in (project.root / "data/batches").glob("*.parquet")]
        assert (project.root / "data/batches.dvc").exists()   # the DVC snapshot of the accepted batches
        versions = project.registry(MODEL)["versions"]
        newest = versions[max(versions, key=int)]
        assert newest["trigger"] == "retrain" and newest["retrain_batch"] == batch
        assert batch in newest["data_batches"] and newest["dvc_batches_md5"]
        assert f"v{max(versions, key=int)}" in decisions[-1].reasons[0]
        status = project.torchship("status")
        assert "fired" in status.stdout and "retrained" in status.stdout, status.stdout[-3000:]


HOLD = """
import time, sys
from pathlib import Path
from prefect import flow
from flows.slot import workspace_slot

@flow
def hold():
    with workspace_slot("a test holder", 5):
        Path("held").write_text("yes")
        while not Path("release").exists():
            time.sleep(0.1)
hold()
"""


@pytest.mark.timeout(300)
def test_a_held_workspace_drops_the_retrain_and_refuses_a_pipeline_run(tiny_pipeline, prefect_server, tmp_path):
    project, _ = tiny_pipeline
    api = prefect_server.api_url()
    (project.root / "hold.py").write_text(HOLD)
    with workspace_restored(project, MODEL):
        holder = start_child("slot holder", [str(BIN / "python"), "hold.py"], tmp_path / "holder.log",
                             env=project_env(project, api), cwd=project.root)
        try:
            with running([holder]):
                deadline = time.monotonic() + 120
                while not (project.root / "held").exists():
                    assert time.monotonic() < deadline and holder.process.poll() is None, holder.output_tail()
                    time.sleep(0.2)
                refused = project.torchship("run")
                retrain = subprocess.run(
                    [str(BIN / "python"), "-c", "from flows.loop import retrain\nprint(retrain(labels_until=1.0))"],
                    cwd=project.root, env=project_env(project, api), capture_output=True, text=True, timeout=120)
                (project.root / "release").write_text("now")
                holder.process.wait(timeout=60)
        finally:
            for name in ("hold.py", "held", "release"):
                (project.root / name).unlink(missing_ok=True)
        assert refused.returncode == 2 and "workspace is busy" in refused.stderr, refused.stderr[-2000:]
        assert "'dropped'" in retrain.stdout, retrain.stdout[-2000:] + retrain.stderr[-2000:]
        assert not (project.root / "data/batches").exists()
        [decision] = read_decisions(project.root / "data/monitor/decisions.jsonl")
        assert decision.outcome == "suppressed" and decision.reasons[0].startswith("workspace busy")


def test_the_workspace_limit_is_made_once_and_found_after_without_a_server_error(prefect_server):
    """Every run ensures its workspace's limit. Creating one that exists made the server log an integrity error
    with its traceback, which the embedded API printed on the console of every run after the first."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.slot import ensure_limit, slot_name

    name = slot_name(prefect_server.log.parent / "a-workspace")
    with temporary_settings({PREFECT_API_URL: prefect_server.api_url()}):
        for _ in range(2):
            ensure_limit(name)
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name(name).limit == 1
    assert "UNIQUE constraint failed" not in prefect_server.output_tail(200_000)
