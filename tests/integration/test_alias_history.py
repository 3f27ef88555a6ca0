"""The alias history on a real MLflow SQLite registry with real processes (no pipeline run: the registry is built
here, its versions point at no artifact): every move recorded once, by torchship's own moves, by the running
service's watcher, or by the next command or monitor when no service runs; `rollback` by the history."""
from __future__ import annotations

import getpass
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from serving.service import Service, ServiceSettings
from tasks.canary.progressive import promote_or_roll_back
from tasks.core.gate import GateResult
from tasks.core.params_spec import CanaryParams, Params, ServeParams
from tasks.core.verdicts import Blessing, BlessOutcome, StepVerdict, VariantFigures
from tasks.monitor import notice_moves
from tasks.register import apply_aliases
from tasks.registry.history import read_history, record_decision
from tasks.registry.lock import alias_lock
from tasks.registry.moves import roll_back
from tasks.registry.read import aliases, registry_client
from tests.conftest import REPO
from tests.integration.test_cli_inprocess import MODEL, cli, project_with_registry  # noqa: F401 (cli: a fixture)

pytestmark = pytest.mark.integration
POLL_S = 1.0          # the service's poll interval in these tests
POLL_WORK_S = 6.0     # what one poll itself may take on a loaded 2-core box (two alias reads, a refused download)
BLESS = {"1": "pass", "2": "pass", "3": "pass", "4": "fail"}   # v4: bless refused it


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A project folder (params.yaml, dvc.yaml) whose registry holds v1-v4 and no alias: built once (MLflow's
    migrations take seconds), copied per test."""
    folder = tmp_path_factory.mktemp("template")
    client = project_with_registry(folder)
    for bless in BLESS.values():
        client.create_model_version(MODEL, source=str(folder / "no-artifact"), tags={"bless": bless})
    return folder


@pytest.fixture
def project(template, tmp_path):
    """(folder, params on its registry, an MLflow client on it)."""
    folder = shutil.copytree(template, tmp_path / "project")
    uri = f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}"
    params = Params.model_validate({"data": {"model_name": MODEL}, "tracking": {"uri": uri}})
    return folder, params, registry_client(params.tracking)


MOVER = textwrap.dedent("""
    import sys
    from mlflow import MlflowClient
    uri, name, version = sys.argv[1:]
    MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias(name, "champion", version)
""")


def moved_by_another_process(params: Params, version: str) -> None:
    """`champion` moved through MLflow's API from another process, as the MLflow UI does: no torchship code."""
    done = subprocess.run([sys.executable, "-c", MOVER, params.tracking.resolved_uri(), MODEL, version],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def blessed(champion: str | None) -> Blessing:
    return Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.BETTER, model_name=MODEL,
                    candidate_path="model.onnx", candidate_sha256="0" * 64, candidate_metrics={"f1_macro": 0.9},
                    champion_version=champion)


def moves(client) -> list[tuple[str, str | None, str | None]]:
    return [(e.alias, e.from_version, e.to_version) for e in read_history(client, MODEL)]


def test_register_canary_promote_hand_move_rollback_entry_by_entry(cli, project):  # noqa: F811
    folder, params, client = project
    apply_aliases(client, MODEL, "1", blessed(None), "pipeline run one", "bless pass; model card of v1")
    apply_aliases(client, MODEL, "2", blessed("1"), "pipeline run two", "bless pass; model card of v2")
    passed = StepVerdict(phase="100%", share=1.0, status="pass", reasons=["all within bounds"],
                         champion=VariantFigures(version="1"), challenger=VariantFigures(version="2"))
    promote_or_roll_back(client, MODEL, "2", [passed], CanaryParams())
    promoted = cli(folder, "promote", "3", "--reason", "the team prefers v3")
    assert promoted.exit_code == 0, promoted.output
    moved_by_another_process(params, "4")
    rolled = cli(folder, "rollback")
    assert rolled.exit_code == 0 and "v3 again" in rolled.stdout, rolled.output
    assert aliases(client, MODEL) == {"champion": "3"}   # the one before the hand move; `previous` named v2

    entries = read_history(client, MODEL)
    assert moves(client) == [("champion", None, "1"), ("challenger", None, "2"), ("champion", "1", "2"),
                             ("challenger", "2", None), ("champion", "2", "3"), ("champion", "3", "4"),
                             ("champion", "4", "3")]
    assert [e.seq for e in entries] == list(range(1, 8)) and {e.model for e in entries} == {MODEL}
    user = getpass.getuser()
    actors = [e.actor for e in entries]
    assert actors[:2] == ["pipeline run one", "pipeline run two"]
    assert actors[2].startswith("canary run") and actors[3] == actors[2]
    assert actors[4].startswith(f"torchship promote by {user}@")
    assert actors[5].startswith("outside torchship, noticed at ") and f"by torchship rollback by {user}@" in actors[5]
    assert actors[6].startswith(f"torchship rollback by {user}@")
    reasons = [e.reason for e in entries]
    assert "first model" in reasons[0] and "the canary decides" in reasons[1]
    assert reasons[2] == reasons[3] == "canary: 1 steps passed up to 100%"
    assert reasons[4] == "by hand: the team prefers v3" and "MLflow UI" in reasons[5]
    assert reasons[6] == "rollback: v4 replaced, v3 was champion before it"
    assert entries[0].evidence == "bless pass; model card of v1" and "canary.*" in entries[2].evidence
    assert "v3 tags bless" in entries[4].evidence

    shown = cli(folder, "history")
    assert shown.exit_code == 0 and "alias history (7 entries)" in shown.stdout, shown.output
    status = " ".join(cli(folder, "status").stdout.split())
    assert "last alias moves" in status and "v3 → v4" in status and "v4 → v3" in status
    assert moves(client)[-1] == ("champion", "4", "3")   # reading the history added nothing


def test_a_move_by_another_process_is_recorded_by_the_running_service_and_rollback_restores_the_one_before(project):
    folder, params, client = project
    client.set_registered_model_alias(MODEL, "champion", "2")
    client.set_model_version_tag(MODEL, "1", "previous", "replaced by v2")   # what the `previous` tag would restore
    settings = ServiceSettings(serve=ServeParams(poll_seconds=POLL_S, request_log=""), model_name=MODEL,
                               tracking=params.tracking)
    service = Service(settings)
    service.start()   # returns after the watcher's first poll: the history starts with what it saw
    try:
        assert [(e.kind, e.to_version) for e in read_history(client, MODEL)] == [("start", "2")]
        moved_by_another_process(params, "4")
        moved_at = time.monotonic()
        while len(read_history(client, MODEL)) < 2 and time.monotonic() - moved_at < POLL_S + POLL_WORK_S:
            time.sleep(0.1)
        noticed = read_history(client, MODEL)[-1]
        assert (noticed.from_version, noticed.to_version) == ("2", "4"), "not recorded within the poll interval"
        assert noticed.actor.startswith("outside torchship, noticed at") and "registry watcher" in noticed.actor
        service.refresh()   # a poll handled: the champion's verdict has reached the metrics
        assert b"torchship_champion_unblessed 1.0" in service.metrics.exposition()   # v4 serves, and a ticket says so

        done = roll_back(params)
        assert (done.restored, done.replaced) == ("2", "4") and aliases(client, MODEL) == {"champion": "2"}
        service.refresh()
        assert b"torchship_champion_unblessed 0.0" in service.metrics.exposition()
        assert moves(client) == [("champion", None, "2"), ("champion", "2", "4"), ("champion", "4", "2")]
    finally:
        service.stop()


OBSERVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tasks.core.params_spec import TrackingParams
    from tasks.registry.history import record_outside_moves
    from tasks.registry.read import registry_client
    uri, name, go, who = sys.argv[1:]
    client = registry_client(TrackingParams(uri=uri))
    client.get_registered_model(name)          # warm: both observers start from the same line
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    print(len(record_outside_moves(client, name, who)))
""")


def test_with_no_service_two_observers_record_a_move_once_and_rollback_follows_the_history(project, tmp_path):
    folder, params, client = project
    client.set_registered_model_alias(MODEL, "champion", "1")
    notice_moves(params)   # the monitor: the history starts
    client.set_registered_model_alias(MODEL, "champion", "3")
    notice_moves(params)
    client.set_registered_model_alias(MODEL, "champion", "2")   # MLflow's API, no torchship code (as the UI)
    go = tmp_path / "go"
    observers = [subprocess.Popen([sys.executable, "-c", OBSERVER, params.tracking.resolved_uri(), MODEL, str(go),
                                   f"observer {i}"], cwd=REPO, stdout=subprocess.PIPE, text=True) for i in (1, 2)]
    assert [o.stdout.readline().strip() for o in observers] == ["ready", "ready"]
    go.touch()   # both at once
    written = sorted(int(o.communicate(timeout=120)[0]) for o in observers)
    assert written == [0, 1]   # one recorded it, the other found it recorded
    notice_moves(params)       # a third observer, later: nothing new
    assert moves(client) == [("champion", None, "1"), ("champion", "1", "3"), ("champion", "3", "2")]
    assert "observer" in read_history(client, MODEL)[-1].actor
    with alias_lock(client, MODEL):   # a decision that moves no alias joins the sequence (an approval, by a person)
        record_decision(client, MODEL, "approval", "alice", "reviewed the model card", version="4")
    notice_moves(params)
    assert len(read_history(client, MODEL)) == 4 and read_history(client, MODEL)[-1].kind == "approval"
    assert roll_back(params).restored == "3"   # no `previous` tag anywhere: the history alone knows
