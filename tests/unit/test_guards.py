"""The drift -> retrain guards, one rule per test: each decision names the guard that held it back."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tasks.core.gate import GateResult
from tasks.core.params_spec import RetrainParams
from tasks.monitoring import guards
from tasks.monitoring.window import Window, read_window

NOW = 1_800_000_000.0   # a fixed clock (2027-01-15, mid-day UTC)
DRIFT = GateResult(gate="drift", status="fail", reasons=["6 of 11 features drifted"])
RULES = RetrainParams(min_new_labels=100, cooldown_minutes=60, max_per_day=3)


def window(labelled: int, unlabelled: int = 0, start: float = NOW - 600, version: str = "3") -> Window:
    rows = labelled + unlabelled
    ts = [start + i for i in range(rows)]
    frame = pd.DataFrame({"id": [f"r-{i}" for i in range(rows)], "ts": ts, "variant": "champion", "version": version,
                          "prediction": "no", "label": ["yes"] * labelled + [None] * unlabelled, "x": 1.0})
    return Window(rows=frame, features=["x"], start=ts[0], end=ts[-1])


def fired(ts: float) -> guards.Decision:
    return guards.Decision(ts=ts, outcome="fired", reasons=[], gate=DRIFT, window={})


def retrained(ts: float, labels_until: float) -> guards.Decision:
    return guards.Decision(ts=ts, outcome="retrained", reasons=[],
                           gate=GateResult(gate="batch contract", status="pass"), window={}, labels_until=labels_until)


def test_drift_with_enough_new_labels_fires():
    assert guards.decide_retrain(DRIFT, window(150), [], RULES, NOW) == (
        "fired", ["every guard passed: 150 new labelled rows (>= 100), no retrain before, 0 of 3 retrains today"])


def test_no_drift_never_fires():
    warned = GateResult(gate="drift", status="warn", reasons=["2 drifted"])
    outcome, _ = guards.decide_retrain(warned, window(500), [], RULES, NOW)
    assert outcome == "no drift"


def test_too_few_new_labels_suppresses():
    outcome, reasons = guards.decide_retrain(DRIFT, window(40, unlabelled=900), [], RULES, NOW)
    assert outcome == "suppressed" and reasons == ["40 new labelled rows < retrain.min_new_labels 100"]


def test_cooldown_suppresses_until_it_has_passed():
    recent = [fired(NOW - 30 * 60)]
    outcome, reasons = guards.decide_retrain(DRIFT, window(150), recent, RULES, NOW)
    assert outcome == "suppressed" and reasons[0].startswith("cooldown: the last retrain fired 30.0 min ago")
    assert guards.decide_retrain(DRIFT, window(150), [fired(NOW - 61 * 60)], RULES, NOW)[0] == "fired"


def test_daily_budget_counts_todays_retrains_only():
    today = [fired(NOW - h * 3600) for h in (2, 3, 4)]
    outcome, reasons = guards.decide_retrain(DRIFT, window(150), today, RULES, NOW)
    assert outcome == "suppressed"
    assert reasons == ["daily budget: 3 retrain(s) fired today (UTC), retrain.max_per_day 3"]
    yesterday = [fired(NOW - 86400 - h * 3600) for h in (2, 3, 4)]
    assert guards.decide_retrain(DRIFT, window(150), yesterday, RULES, NOW)[0] == "fired"


def test_loop_protection_labels_a_retrain_used_do_not_count_again():
    traffic = window(150)
    history = [retrained(NOW - 2 * 3600, labels_until=traffic.end)]   # the last retrain learned from all of them
    outcome, reasons = guards.decide_retrain(DRIFT, traffic, history, RULES, NOW)
    assert outcome == "suppressed"
    assert reasons == ["0 new labelled rows < retrain.min_new_labels 100 (150 more were already used by an earlier "
                       "retrain: loop protection)"]


def test_loop_protection_a_retrained_models_own_predictions_cannot_trigger():
    outcome, reasons = guards.decide_retrain(DRIFT, window(150, version="5"), [], RULES, NOW, retrained_versions={"5"},
                                     prediction_only=True)
    assert outcome == "suppressed" and reasons[0].startswith("loop protection: only the predictions moved")
    # the same prediction drift on a version that no retrain produced is evidence
    assert guards.decide_retrain(DRIFT, window(150, version="4"), [], RULES, NOW, retrained_versions={"5"},
                         prediction_only=True)[0] == "fired"


def test_disabled_retrain_only_reports():
    outcome, reasons = guards.decide_retrain(DRIFT, window(150), [], RULES.model_copy(update={"enabled": False}), NOW)
    assert outcome == "suppressed" and reasons == ["retrain.enabled is false: the monitor only reports"]


def test_every_guard_that_holds_is_named():
    history = [fired(NOW - 60)] * 3
    _, reasons = guards.decide_retrain(DRIFT, window(10), history, RULES, NOW)
    assert [r.split(":")[0].split(" ")[0] for r in reasons] == ["10", "cooldown", "daily"]


def test_decisions_round_trip_and_a_cut_line_is_skipped(tmp_path):
    path = tmp_path / "decisions.jsonl"
    guards.record(path, guards.make_decision("fired", ["why"], DRIFT, window(3), ts=NOW))
    with path.open("a") as handle:
        handle.write('{"ts": 1, "outcome": "fi')   # a crash mid-line
    [decision] = guards.read_decisions(path)
    assert decision.outcome == "fired" and decision.labels_until == window(3).end and decision.window["labelled"] == 3
    assert decision.gate == DRIFT


class FakeBucket:
    """The three S3 calls the decision log makes, on a dict."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def put_object(self, Bucket, Key, Body):
        self.objects[f"{Bucket}/{Key}"] = Body

    def get_object(self, Bucket, Key):
        import io

        return {"Body": io.BytesIO(self.objects[f"{Bucket}/{Key}"])}

    def get_paginator(self, _):
        objects = self.objects

        class Pages:
            def paginate(self, Bucket, Prefix):
                keys = sorted(k.split("/", 1)[1] for k in objects if k.startswith(f"{Bucket}/{Prefix}"))
                return [{"Contents": [{"Key": key} for key in keys]}]
        return Pages()


def test_with_a_shipped_log_the_decisions_are_one_object_each_in_the_bucket_in_time_order(monkeypatch):
    """The team topology: a monitor and a retrain in two fresh clones both see every decision."""
    from tasks.core import bucket
    from tasks.core.params_spec import ServeParams

    store = FakeBucket()
    monkeypatch.setattr(bucket, "s3_client", lambda: store)
    where = guards.decision_log(ServeParams(ship_to="s3://team/serve-logs/"), Path("unused.jsonl"))
    assert where == "s3://team/serve-logs/decisions"
    assert guards.decision_log(ServeParams(ship_to=""), Path("here.jsonl")) == Path("here.jsonl")
    for ts, outcome in ((NOW + 5, "retrained"), (NOW, "fired")):   # recorded by two workers, the later first
        guards.record(where, guards.make_decision(outcome, [outcome], DRIFT, window(3), ts=ts))
    assert all(key.startswith("team/serve-logs/decisions/") for key in store.objects)
    assert [d.outcome for d in guards.read_decisions(where)] == ["fired", "retrained"]
    assert guards.high_water(guards.read_decisions(where)) == window(3).end


def test_window_reads_newest_rows_across_rotated_files_and_joins_feedback(tmp_path):
    from tasks.core.params_spec import MonitorParams
    from tasks.core.servelog import feedback_line, rotated_path, served_line

    log = tmp_path / "requests.jsonl"
    rotated_path(log, "20270101T000000Z").write_text("".join(
        served_line("a", i, "champion", "1", {"x": i}, "no", {"no": 1.0}, ts=100.0 + i) for i in range(60)))
    log.write_text("".join(served_line("b", i, "champion", "2", {"x": 100 + i}, "yes", {"yes": 1.0}, ts=200.0 + i)
                           for i in range(40)) + '{"cut')
    (tmp_path / "feedback.jsonl").write_text(feedback_line("b-3", "no") + feedback_line("a-59", "yes"))
    found = read_window(log, MonitorParams(window_rows=50))
    assert len(found.rows) == 50 and found.versions() == {"2": 40, "1": 10}
    assert found.rows["x"].tolist() == list(range(50, 60)) + list(range(100, 140))
    assert found.labelled.set_index("id")["label"].to_dict() == {"a-59": "yes", "b-3": "no"}
    since = read_window(log, MonitorParams(), since=230.0)
    assert since.rows["ts"].min() == 230.0 and len(since.rows) == 10
    assert json.loads(log.read_text().splitlines()[0])["request_id"] == "b"


def test_an_empty_log_is_refused_with_what_to_do(tmp_path):
    from tasks.core.errors import TorchshipError
    from tasks.core.params_spec import MonitorParams

    with pytest.raises(TorchshipError, match="torchship serve"):
        read_window(tmp_path / "requests.jsonl", MonitorParams())
