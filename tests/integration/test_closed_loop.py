"""The workspace's one-writer rule on Prefect's own machinery: a Prefect concurrency limit, while held, drops a
retrain and refuses a pipeline run; and the limit is made once. (The closed loop itself, drift event -> the
`retrain` deployment on a process worker -> a new version with its lineage, runs in
tests/integration/test_journey.py on the team stack, across hosts.)"""
from __future__ import annotations

import subprocess
import time

import pytest

from tasks.core.procs import running, start_child
from tasks.monitoring.guards import read_decisions
from tests.conftest import BIN
from tests.helpers import workspace_restored

MODEL = "synthetic-churn"


def project_env(project, api: str) -> dict[str, str]:
    """The project's environment on the session's server, with a worker that polls every second."""
    return {**project.env(), "PREFECT_API_URL": api, "PREFECT_HOME": str(project.root / ".prefect"),
            "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}


HOLD = """
import time, sys
from pathlib import Path
from prefect import flow
from tasks.workspace.lock import workspace_lock

@flow
def hold():
    with workspace_lock("a test holder", 5):
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
                    [str(BIN / "python"), "-c", "from flows.retrain import retrain\nprint(retrain(labels_until=1.0))"],
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

    from tasks.core.prefect_limits import ensure_limit
    from tasks.workspace.lock import workspace_limit_name

    name = workspace_limit_name(prefect_server.log.parent / "a-workspace")
    printed_before = prefect_server.log.stat().st_size
    with temporary_settings({PREFECT_API_URL: prefect_server.api_url()}):
        for _ in range(2):
            ensure_limit(name)
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name(name).limit == 1
    # the session's server is shared: another test's race for a limit of its own may print the same error meanwhile
    with prefect_server.log.open("rb") as handle:
        handle.seek(printed_before)
        printed = handle.read().decode(errors="replace")
    errors = [chunk for chunk in printed.split("UNIQUE constraint failed")[1:] if name in chunk[:2000]]
    assert not errors, errors[0][:2000]
