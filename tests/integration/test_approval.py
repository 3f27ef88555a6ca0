"""The approval step (promotion.approval: required) on a real MLflow SQLite registry, no pipeline run (the
versions point at no artifact): register leaves the version awaiting approval with no alias; the canary starts
only on `torchship approve` (or a tag set in the MLflow UI); `reject` and the timeout leave `champion` untouched;
every decision and the person are in the alias history."""
from __future__ import annotations

import shutil
import time

import pytest
from ruamel.yaml import YAML

from tasks.core.errors import TorchshipError
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.verdicts import Blessing, BlessOutcome, CanaryOutcome, CanaryReport, RegistrationOutcome
from tasks.register import apply_aliases
from tasks.registry.approvals import (
    APPROVAL_TAG,
    DECIDED_TAG,
    approved_challenger_without_canary,
    decide_by_hand,
    review_approvals,
)
from tasks.registry.history import os_user, read_history
from tasks.registry.read import aliases, registry_client
from tasks.registry.status import registry_status
from tests.integration.test_cli_inprocess import MODEL, cli, project_with_registry  # noqa: F401 (cli: a fixture)

pytestmark = pytest.mark.integration
TIMEOUT_S = 2.0     # the short approval timeout of the timeout test


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A project (params.yaml with promotion.approval required) whose registry holds v1 (champion, blessed) and
    v2-v3 (blessed against v1, no alias yet): built once (MLflow's migrations take seconds), copied per test."""
    folder = tmp_path_factory.mktemp("template")
    client = project_with_registry(folder)
    for _ in range(3):
        client.create_model_version(MODEL, source=str(folder / "no-artifact"),
                                    tags={"bless": "pass", "parent_version": "1"})
    client.set_registered_model_alias(MODEL, "champion", "1")
    yaml = YAML()
    raw = yaml.load(folder / "params.yaml")
    raw["promotion"]["approval"] = "required"
    yaml.dump(raw, folder / "params.yaml")
    return folder


@pytest.fixture
def project(template, tmp_path):
    """(folder, params on its registry, an MLflow client on it)."""
    folder = shutil.copytree(template, tmp_path / "project")
    uri = f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}"
    params = Params.model_validate({"data": {"model_name": MODEL}, "tracking": {"uri": uri},
                                    "promotion": {"approval": "required"}})
    return folder, params, registry_client(params.tracking)


def awaiting(client, version: str) -> None:
    """Register's alias step for a blessed `version` with approval required."""
    blessing = Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.BETTER, model_name=MODEL,
                        candidate_path="model.onnx", candidate_sha256="0" * 64, candidate_metrics={"f1_macro": 0.9},
                        champion_version="1")
    outcome, action = apply_aliases(client, MODEL, version, blessing, "pipeline run test", approval=True)
    assert outcome is RegistrationOutcome.AWAITING_APPROVAL and f"v{version} awaits approval" in action


def decisions(client) -> list[tuple[str | None, str]]:
    """(version, reason) of each approval entry of the history, oldest first."""
    return [(e.to_version, e.reason) for e in read_history(client, MODEL) if e.kind == "approval"]


def test_the_canary_starts_only_when_a_person_approves(cli, project, monkeypatch):  # noqa: F811
    folder, params, client = project
    started = []

    def canary_flow(params_file: str = "params.yaml", **_):   # the real flow needs a model: its call is the point
        started.append(aliases(client, MODEL))
        return CanaryReport(gate=GateResult.decide("canary", []), outcome=CanaryOutcome.PROMOTED, action="stub")

    monkeypatch.setattr("flows.canary.canary_flow", canary_flow)
    awaiting(client, "2")
    assert aliases(client, MODEL) == {"champion": "1"}              # no alias: nothing routes traffic to it
    assert client.get_model_version(MODEL, "2").tags[APPROVAL_TAG] == "waiting"
    assert approved_challenger_without_canary(params) is None        # the monitor starts no canary
    status = cli(folder, "status")
    assert status.exit_code == 0, status.output
    assert "v2 awaits approval" in " ".join(status.stdout.split()) and started == []

    approved = cli(folder, "approve", "2", "--reason", "read the model card")
    assert approved.exit_code == 0, approved.output
    assert started == [{"champion": "1", "challenger": "2"}]          # the canary started once, on v2
    assert client.get_model_version(MODEL, "2").tags[APPROVAL_TAG] == f"approved:{os_user()}"
    entries = read_history(client, MODEL)
    assert [(e.kind, e.alias, e.to_version) for e in entries[-3:]] == [
        ("approval", None, "2"), ("approval", None, "2"), ("move", "challenger", "2")]
    assert entries[-2].reason == f"approved by {os_user()}: read the model card"
    assert entries[-2].actor.startswith(f"torchship approve by {os_user()}@")
    again = cli(folder, "approve", "2", "--reason", "twice")          # settled: no second canary, no entry
    assert again.exit_code == 0 and "already decided" in again.stdout and len(started) == 1
    assert len(read_history(client, MODEL)) == len(entries)
    shown = cli(folder, "history")
    assert shown.exit_code == 0 and f"({len(entries)} entries)" in shown.stdout and "approval" in shown.stdout


def test_reject_and_the_timeout_leave_the_champion_untouched(project):
    _, params, client = project
    awaiting(client, "2")
    done = decide_by_hand(params, "2", "rejected", "not this quarter", "torchship reject by test", "carol")
    assert done.outcome == "rejected" and aliases(client, MODEL) == {"champion": "1"}
    tags = client.get_model_version(MODEL, "2").tags
    assert tags[APPROVAL_TAG] == "rejected:carol" and "rejected" in tags and DECIDED_TAG in tags

    short = params.model_copy(update={"promotion": params.promotion.model_copy(
        update={"approval_timeout_s": TIMEOUT_S})})
    awaiting(client, "3")
    acted, waiting = review_approvals(short, "the monitor")
    assert acted == [] and [w.version for w in waiting] == ["3"]       # within the timeout: still waiting
    deadline = time.monotonic() + 10 * TIMEOUT_S                       # bounded: the timeout passes meanwhile
    while not acted and time.monotonic() < deadline:
        time.sleep(0.2)
        acted, waiting = review_approvals(short, "the monitor")
    assert [(a.version, a.outcome) for a in acted] == [("3", "timed out")] and waiting == []
    assert aliases(client, MODEL) == {"champion": "1"}
    assert "rejected" in client.get_model_version(MODEL, "3").tags
    assert [reason.split(":")[0] for _, reason in decisions(client)] == [
        "awaiting approval", "rejected by carol", "awaiting approval", "timed out"]
    assert read_history(client, MODEL)[-1].actor == "the monitor"
    assert review_approvals(short, "the monitor") == ([], [])          # settled: never acted on twice


def test_an_approval_tag_set_in_the_mlflow_ui_is_honoured_once(project):
    _, params, client = project
    awaiting(client, "2")
    awaiting(client, "3")
    client.set_model_version_tag(MODEL, "3", APPROVAL_TAG, "approved:bob")   # what the MLflow UI's tag form does
    client.set_model_version_tag(MODEL, "2", APPROVAL_TAG, " Approved: alice ")
    acted, _ = review_approvals(params, "the monitor")                  # two observers, one after the other
    registry_status(params)
    by_version = {a.version: a for a in acted}
    assert by_version["2"].outcome == "approved" and by_version["2"].canary_due
    assert by_version["3"].outcome == "blocked" and "v2 holds `challenger`" in by_version["3"].action
    assert aliases(client, MODEL) == {"champion": "1", "challenger": "2"}
    assert approved_challenger_without_canary(params) == "2"            # what the monitor's canary starts on
    approvals = [reason for version, reason in decisions(client) if reason.startswith("approved")]
    assert approvals == ["approved by alice: the MLflow tag approval=' Approved: alice '"]   # once, by alice
    assert "alice (tag approval set outside torchship, noticed by the monitor)" in read_history(client, MODEL)[-2].actor

    client.delete_registered_model_alias(MODEL, "challenger")          # v2's canary ended (rolled back)
    client.set_model_version_tag(MODEL, "2", "canary.shadow", "fail: test")
    acted, _ = review_approvals(params, "the pipeline")                 # bob's approval waited for it
    assert [(a.version, a.outcome, a.approver) for a in acted] == [("3", "approved", "bob")]
    assert aliases(client, MODEL) == {"champion": "1", "challenger": "3"}


def test_the_prefect_ui_form_decides_and_an_approval_starts_the_canary(project, monkeypatch):
    """The `review` deployment's form: its fields are the flow's parameters (Prefect renders the form from this
    schema); the flow's body decides as `approve|reject` do, with the reviewer as the person, and an approval starts
    the canary (here without a server: the canary flow itself; on a server: a run of the canary deployment)."""
    from prefect.utilities.callables import parameter_schema

    from flows.review import review

    folder, _, client = project
    form = parameter_schema(review.fn).model_dump_for_openapi()
    assert form["required"] == ["version", "decision", "reviewer", "reason"]
    assert form["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert all(form["properties"][field].get("description") for field in form["required"])

    started = []
    monkeypatch.setattr("flows.canary.canary_flow", lambda params_file="params.yaml", **_: started.append(
        aliases(client, MODEL)) or CanaryReport(gate=GateResult.decide("canary", []), outcome=CanaryOutcome.PROMOTED,
                                                action="stub"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.chdir(folder)
    awaiting(client, "2")
    awaiting(client, "3")
    with pytest.raises(TorchshipError, match="reviewer"):   # nobody named: nothing decided
        review.fn("3", "reject", "  ", "too slow on the dashboard")
    assert client.get_model_version(MODEL, "3").tags[APPROVAL_TAG] == "waiting"
    review.fn("3", "reject", " dana ", "too slow on the dashboard")
    assert client.get_model_version(MODEL, "3").tags[APPROVAL_TAG] == "rejected:dana" and started == []
    review.fn("2", "approve", "erin", "model card read")
    assert started == [{"champion": "1", "challenger": "2"}]
    entries = [e for e in read_history(client, MODEL) if e.kind == "approval"]
    assert [e.reason for e in entries[-2:]] == ["rejected by dana: too slow on the dashboard",
                                                "approved by erin: model card read"]
    assert all(e.actor == "the Prefect UI form" for e in entries[-2:])
