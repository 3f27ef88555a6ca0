"""Notifications' pure rules: which state a notice reports (its dedup key), and the sender's bounded retries."""
from __future__ import annotations

import httpx
import pytest

from tasks.core.env import WEBHOOK_URL_ENV
from tasks.core.gate import GateResult
from tasks.core.params_spec import NotifyParams
from tasks.monitoring.guards import Decision
from tasks.monitoring.trigger_notifications import decision_notice
from tasks.registry.notifications import Notice, notify_once, post_webhook, retried


def decision(ts: float, outcome: str) -> Decision:
    return Decision(ts=ts, outcome=outcome, reasons=[outcome], gate=GateResult.decide("drift", []), window={})


def keys(outcomes: list[str]) -> list[tuple[str, str] | None]:
    """(event, key) of each decision's notice, each judged against the decisions before it."""
    made = [decision(float(ts), outcome) for ts, outcome in enumerate(outcomes, 1)]
    return [(n.event, n.key) if (n := decision_notice("m", d, made[:i])) else None for i, d in enumerate(made)]


def test_each_fired_retrain_is_its_own_state():
    assert keys(["fired", "retrained", "fired"]) == [("retrain-fired", "1.000"), None, ("retrain-fired", "3.000")]


def test_a_run_of_suppressions_is_one_state_and_a_new_run_another():
    found = keys(["suppressed", "suppressed", "no drift", "suppressed", "suppressed", "fired", "suppressed"])
    suppressed = [key for key in found if key and key[0] == "retrain-suppressed"]
    assert [key for _, key in suppressed] == ["after-0.000", "after-0.000", "after-3.000", "after-3.000",
                                               "after-6.000"]
    assert len({key for _, key in suppressed}) == 3      # three notices: first, after no drift, after a fire


def test_a_notice_claims_a_valid_mlflow_tag_key():
    notice = Notice(event="approval-waiting", key="v7 at 12:00/x", model="m", text="t")
    assert notice.tag() == "notified.approval-waiting.v7_at_12_00_x"
    assert set(notice.body()) == {"event", "key", "model", "text", "time"}


@pytest.mark.parametrize(("status", "again"), [(None, True), (500, True), (503, True), (429, True), (408, True),
                                                (400, False), (404, False), (410, False)])
def test_what_is_retried(status, again):
    assert retried(status) is again


def fake_post(monkeypatch, answers: list):
    """httpx.post answering each call with the next of `answers` (a status, or an exception to raise)."""
    calls = []

    def post(url, **_):
        calls.append(url)
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)

    monkeypatch.setattr(httpx, "post", post)
    return calls


def test_retries_are_bounded_and_back_off(monkeypatch):
    calls = fake_post(monkeypatch, [httpx.ConnectError("refused")] + [503] * 10)
    waits: list[float] = []
    delivered, said = post_webhook("http://x", {}, NotifyParams(retries=3, retry_delay_s=0.5), waits.append)
    assert not delivered and len(calls) == 4 and waits == [0.5, 1.0, 2.0] and "HTTP 503 after 4" in said


def test_a_later_success_delivers_and_a_client_error_is_not_retried(monkeypatch):
    calls = fake_post(monkeypatch, [500, 204])
    assert post_webhook("http://x", {}, NotifyParams(retry_delay_s=0), lambda _: None)[0] and len(calls) == 2
    calls = fake_post(monkeypatch, [400, 200])
    assert not post_webhook("http://x", {}, NotifyParams(retry_delay_s=0), lambda _: None)[0] and len(calls) == 1


def test_nothing_is_sent_without_a_url_or_for_an_event_switched_off():
    notice = Notice(event="retrain-fired", key="1", model="m", text="t")
    # client None: neither reaches the registry
    assert notify_once(None, notice, NotifyParams(), environ={}) == f"off ({WEBHOOK_URL_ENV} not set)"
    assert notify_once(None, notice, NotifyParams(events=["approval-waiting"]), environ={WEBHOOK_URL_ENV: "http://x"}
                       ) == "off (notify.events)"
