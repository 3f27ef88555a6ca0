"""Notifications against a real webhook receiver on 127.0.0.1 (a small http.server in a thread) and a real MLflow
SQLite registry: each change of state arrives exactly once, however many observers see it; a receiver that fails
once gets it on a retry; one that never answers leaves the notice to the next observer."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tasks.core.env import WEBHOOK_URL_ENV
from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.verdicts import CanaryOutcome, CanaryReport, StepVerdict, VariantFigures
from tasks.monitor import notice_moves
from tasks.monitoring import guards
from tasks.monitoring.trigger_notifications import announce_decision
from tasks.registry.approvals import review_approvals
from tasks.registry.notifications import Notice, notify_once
from tasks.registry.read import registry_client
from tasks.registry.status import registry_status
from tests.integration.test_approval import awaiting
from tests.integration.test_cli_inprocess import MODEL, project_with_registry

pytestmark = pytest.mark.integration


class Receiver(ThreadingHTTPServer):
    """Records every JSON body posted; a path `/fail-once` answers 503 the first time."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.failed: list[str] = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):   # noqa: N802 (http.server's name)
        server: Receiver = self.server
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/fail-once" and self.path not in server.failed:
            server.failed.append(self.path)
            self.send_response(503)
        else:
            server.bodies.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):   # quiet
        pass


@pytest.fixture
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def project(tmp_path, monkeypatch, receiver):
    """Params on a registry with v1 champion (blessed), v2-v3 blessed against it, v4 refused by bless; the webhook
    set to the receiver; trigger decisions in their own file."""
    client = project_with_registry(tmp_path)
    for bless in ("pass", "pass", "pass", "fail"):
        client.create_model_version(MODEL, source=str(tmp_path / "no-artifact"),
                                    tags={"bless": bless, "parent_version": "1"})
    client.set_registered_model_alias(MODEL, "champion", "1")
    params = Params.model_validate({"data": {"model_name": MODEL},
                                    "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"},
                                    "promotion": {"approval": "required"}, "notify": {"retry_delay_s": 0.0}})
    monkeypatch.setenv(WEBHOOK_URL_ENV, receiver.url)
    return params, registry_client(params.tracking), tmp_path / "decisions.jsonl"


def received(receiver: Receiver) -> list[tuple[str, str]]:
    return [(body["event"], body["key"]) for body in receiver.bodies]


def test_each_change_of_state_is_notified_exactly_once(project, receiver):
    params, client, decisions = project
    awaiting(client, "2")                                   # an approval is waiting: two observers see it
    review_approvals(params, "the monitor")
    review_approvals(params, "the pipeline")
    client.set_registered_model_alias(MODEL, "champion", "4")   # an unblessed champion, moved as the MLflow UI does
    registry_status(params)
    notice_moves(params)
    registry_status(params)
    rolled_back = CanaryReport(gate=GateResult.decide("canary", []), outcome=CanaryOutcome.ROLLED_BACK, action="x",
                               steps=[StepVerdict(phase="25%", share=0.25, status="fail", reasons=["5xx"],
                                                  champion=VariantFigures(version="4"),
                                                  challenger=VariantFigures(version="3"))])
    from tasks.canary import rollback_notice

    for _ in range(2):                                      # the canary's record, observed twice
        notify_once(client, rollback_notice(MODEL, rolled_back), params.notify)
    for ts, outcome in enumerate(["fired", "suppressed", "suppressed", "no drift", "suppressed"], 1):
        made = guards.record(decisions, guards.Decision(ts=float(ts), outcome=outcome, reasons=[outcome],
                                                        gate=GateResult.decide("drift", []), window={}))
        announce_decision(params, made, decisions)
        announce_decision(params, made, decisions)          # a second observer of the same decision
    assert received(receiver) == [("approval-waiting", "v2"), ("champion-unblessed", "v4"),
                                  ("canary-rolled-back", "v3"), ("retrain-fired", "1.000"),
                                  ("retrain-suppressed", "after-1.000"), ("retrain-suppressed", "after-4.000")]
    assert all(body["model"] == MODEL and body["text"] for body in receiver.bodies)
    assert "v2 awaits approval until" in receiver.bodies[0]["text"]


def test_a_failed_delivery_is_retried_and_one_never_delivered_is_left_to_the_next_observer(project, receiver,
                                                                                          monkeypatch):
    params, client, _ = project
    notice = Notice(event="retrain-fired", key="7", model=MODEL, text="drift")
    monkeypatch.setenv(WEBHOOK_URL_ENV, receiver.url + "/fail-once")
    assert notify_once(client, notice, params.notify).startswith("sent: HTTP 204 after 2 attempt(s)")
    assert received(receiver) == [("retrain-fired", "7")] and receiver.failed == ["/fail-once"]

    with socket.socket() as closed:                         # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv(WEBHOOK_URL_ENV, f"http://127.0.0.1:{closed.getsockname()[1]}")
        later = notice.model_copy(update={"key": "8"})
        assert notify_once(client, later, params.notify.model_copy(update={"retries": 1})).startswith(
            "not delivered")
    assert later.tag() not in client.get_registered_model(MODEL).tags   # the claim was taken back
    monkeypatch.setenv(WEBHOOK_URL_ENV, receiver.url)
    assert notify_once(client, later, params.notify).startswith("sent")
    assert notify_once(client, later, params.notify) == "claimed already"
    assert received(receiver) == [("retrain-fired", "7"), ("retrain-fired", "8")]
