"""The drift loop on a real Prefect server, deployed from the project's prefect.yaml by `torchship deploy`: the
drift runbook's pause and resume commands (docs/runbooks.md) stop and restart both the monitor deployment's
schedule and the retrain trigger, and a storm of twenty drift events for one model creates one retrain run.

No worker runs: a flow run nobody picks up stays Scheduled, so what is counted is the runs the trigger creates,
which is what its debounce (prefect.yaml: threshold 1 within retrain.cooldown_minutes) decides. A run that
does not exist cannot reach Running."""
from __future__ import annotations

import datetime as dt
import shlex
import subprocess
import time
import uuid

import httpx
import pytest

from flows.monitor import DRIFT_EVENT
from tests.conftest import BIN, make_project, start_prefect_server, stop_prefect_server
from tests.reliability.test_runbooks import fix_commands

RETRAIN, MONITOR = "torchship-retrain/retrain", "torchship-monitor/monitor"
TRIGGER = "torchship-retrain-on-drift"
STORM = 20


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A server of this module's own with the project's deployments: its trigger and schedules must not start runs
    that the closed loop's worker (on the session's server) would pick up."""
    server = start_prefect_server(tmp_path_factory.mktemp("storm-server"))
    try:
        project = make_project(tmp_path_factory.mktemp("storm-project"), prefect=server)
        done = project.torchship("deploy", timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        with httpx.Client(base_url=server.api_url(), timeout=30) as api:
            yield project, api
    finally:
        stop_prefect_server(server)


def deployment(api: httpx.Client, name: str) -> dict:
    found = api.get(f"/deployments/name/{name}")
    assert found.status_code == 200, found.text
    return found.json()


def automation(api: httpx.Client, name: str) -> dict:
    [found] = [a for a in api.post("/automations/filter", json={}).json() if a["name"] == name]
    return found


def runs_of(api: httpx.Client, name: str, reasons: set[str] | None = None) -> list[dict]:
    """The deployment's flow runs (those whose `reason` parameter is one of `reasons`, when given)."""
    runs = api.post("/flow_runs/filter", json={"flow_runs": {
        "deployment_id": {"any_": [deployment(api, name)["id"]]}}}).json()
    return [r for r in runs if reasons is None or r["parameters"].get("reason") in reasons]


def drift_events(model: str, count: int, reason: str) -> list[dict]:
    """Drift events as the monitor emits them (flows/monitor.py), each its own id."""
    now = dt.datetime.now(dt.UTC)
    return [{"id": str(uuid.uuid4()), "occurred": (now + dt.timedelta(milliseconds=i)).isoformat(),
             "event": DRIFT_EVENT, "resource": {"prefect.resource.id": f"torchship.model.{model}",
                                                "prefect.resource.name": model},
             "payload": {"labels_since": 0.0, "labels_until": 1.0, "report": "", "reason": reason,
                         "params_file": "params.yaml"}} for i in range(count)]


def prefect_cli(project, command: str) -> str:
    """A runbook line, run as an operator's shell runs it in the project (PREFECT_API_URL set)."""
    argv = shlex.split(command)
    assert argv[0] == "prefect", command
    done = subprocess.run([str(BIN / "prefect"), "--no-prompt", *argv[1:]], cwd=project.root, env=project.env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done.stdout


def drift_fixes(verb: str) -> list[str]:
    """The drift runbook's server fix lines that `verb` (pause, resume) the loop."""
    [fixes] = [fixes for title, fixes in fix_commands().items() if title.startswith("A drift alert")]
    return [c for c in fixes if c.startswith("prefect ") and f" {verb} " in c]


def loop_state(api: httpx.Client) -> tuple[bool, list[bool], int]:
    """(trigger enabled, each monitor schedule active, monitor runs waiting in Scheduled)."""
    scheduled = [r for r in runs_of(api, MONITOR) if r["state_type"] == "SCHEDULED"]
    return (automation(api, TRIGGER)["enabled"], [s["active"] for s in deployment(api, MONITOR)["schedules"]],
            len(scheduled))


def test_the_drift_runbook_pauses_and_resumes_the_schedule_and_the_trigger(deployed):
    project, api = deployed
    pause, resume = drift_fixes("pause"), drift_fixes("resume")
    assert len(pause) == 2 and len(resume) == 2, (pause, resume)
    [schedule] = deployment(api, MONITOR)["schedules"]   # `prefect deployment schedule ls` shows its ID
    # Runs the scheduler has already queued (it comes by every minute or so: not waited for) must go too.
    assert loop_state(api)[:2] == (True, [True])
    for line in pause:
        prefect_cli(project, line.replace("$SCHEDULE_ID", schedule["id"]))
    assert loop_state(api) == (False, [False], 0), "the loop is still armed after the runbook paused it"
    for line in resume:
        prefect_cli(project, line.replace("$SCHEDULE_ID", schedule["id"]))
    assert loop_state(api)[:2] == (True, [True])


def test_a_storm_of_drift_events_creates_one_retrain_run(deployed):
    project, api = deployed
    storm, after = f"storm {uuid.uuid4()}", f"after the storm {uuid.uuid4()}"   # this test's runs, by reason
    model = f"storm-{uuid.uuid4().hex[:8]}"   # a model no earlier event of the session has debounced
    events = drift_events(model, STORM, reason=storm)
    try:
        for start in range(0, STORM, 5):   # four batches, as monitors on several hosts send them
            assert api.post("/events", json=events[start:start + 5]).status_code == 204
        # Another model's event, sent after the storm, is debounced apart: once its run exists, the trigger has
        # judged the storm (the server's actions run apart from it, so the storm's run may come second).
        assert api.post("/events", json=drift_events(f"{model}-other", 1, reason=after)).status_code == 204
        deadline = time.monotonic() + 90
        while len({r["parameters"]["reason"] for r in runs_of(api, RETRAIN, {storm, after})}) < 2:
            assert time.monotonic() < deadline, runs_of(api, RETRAIN, {storm, after})
            time.sleep(0.2)
        reasons = [r["parameters"]["reason"] for r in runs_of(api, RETRAIN, {storm, after})]
        assert sorted(reasons) == sorted([storm, after]), f"{STORM} drift events made {reasons.count(storm)} runs"
    finally:   # no worker of a later test may pick these runs up
        for run in runs_of(api, RETRAIN, {storm, after}):
            api.delete(f"/flow_runs/{run['id']}")
