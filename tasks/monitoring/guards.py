"""Whether a drift verdict may start a retrain, and the record of every such decision.

Teams that wire drift to retraining by hand retrain in loops, on a handful of labels, or all day. Each guard
here is one rule with its reason in words; `decide_retrain` is pure (history and clock passed in), so each rule has a
test. The workspace's one-writer rule is a Prefect concurrency limit, taken by the flows (tasks/workspace/lock.py)."""
from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from tasks.core.gate import GateResult
from tasks.core.params_spec import RetrainParams, ServeParams
from tasks.monitoring.window import Window

Outcome = Literal["fired", "suppressed", "no drift", "retrained"]
DECISIONS_FOLDER = "decisions"   # under serve.ship_to, beside the shipped request log and feedback


class Decision(BaseModel):
    ts: float
    outcome: Outcome
    reasons: list[str]
    gate: GateResult                  # the drift gate (or, for a dropped or refused retrain, why)
    window: dict                      # rows, labelled, start, end, versions
    report: str | None = None         # the Evidently HTML report
    summary: str | None = None        # the JSON summary under data/monitor/
    labels_since: float = 0.0         # the labelled rows a retrain takes: served in (labels_since, labels_until]
    labels_until: float = 0.0         # after a retrain, its high-water mark: later retrains need newer labels
    run: str | None = None            # the retrain flow run (or where it was sent)

    def line(self) -> str:
        return self.model_dump_json() + "\n"


def decision_log(serve: ServeParams, local: Path) -> Path | str:
    """Where the decisions are kept: `local` (data/monitor/decisions.jsonl in the one working tree), or, when the
    service ships its log to a bucket (serve.ship_to), `<ship_to>/decisions`, one object per decision: on the team
    topology the monitor and the retrain run in a worker's fresh clone, and the guards (cooldown, budget, the
    labels already learned) must see every earlier run's decisions."""
    return f"{serve.ship_to.rstrip('/')}/{DECISIONS_FOLDER}" if serve.ship_to else local


def read_decisions(where: Path | str) -> list[Decision]:
    """Every decision recorded at `where` (a file, or an s3:// folder of one object per decision), oldest first."""
    if isinstance(where, str):
        lines = bucket_decision_lines(where)
    elif where.exists():
        lines = where.read_text(encoding="utf-8").splitlines()
    else:
        return []
    found = []
    for line in lines:
        try:
            found.append(Decision.model_validate_json(line))
        except ValueError:    # a line cut by a crash: the rest of the history still counts
            continue
    return sorted(found, key=lambda decision: decision.ts) if isinstance(where, str) else found


def record(where: Path | str, decision: Decision) -> Decision:
    """Append one decision: one small write to a file (a whole line or, after a crash, a cut line that readers
    skip), or one new object in the bucket (no read-modify-write: two workers recording at once both land)."""
    if isinstance(where, str):
        from tasks.core.bucket import Location, put_bytes, s3_client

        location = Location.parse(where)
        key = f"{location.prefix}/{decision.ts:017.6f}-{uuid.uuid4().hex[:8]}.json"
        put_bytes(s3_client(), location, key, decision.line().encode())
        return decision
    where.parent.mkdir(parents=True, exist_ok=True)
    with where.open("a", encoding="utf-8") as handle:
        handle.write(decision.line())
    return decision


def bucket_decision_lines(url: str) -> list[str]:
    from tasks.core.bucket import Location, get_text, list_keys, s3_client

    location, client = Location.parse(url), s3_client()
    return [get_text(client, location, key).strip() for key in list_keys(client, location, "")
            if key.endswith(".json")]


def high_water(history: list[Decision]) -> float:
    """The newest labelled row a retrain already learned from."""
    return max((d.labels_until for d in history if d.outcome == "retrained"), default=0.0)


def utc_day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def decide_retrain(gate: GateResult, window: Window, history: list[Decision], rules: RetrainParams, now: float,
                   retrained_versions: set[str] = frozenset(), prediction_only: bool = False,
                   labelled_times: list[float] | None = None) -> tuple[Outcome, list[str]]:
    """fired / suppressed (with every guard that held it back) / no drift.

    `retrained_versions`: registered versions a retrain produced; `prediction_only`: the gate failed on the
    prediction column alone (no feature drift, no quality drop); `labelled_times`: when each labelled example a
    retrain would learn from arrived, if not the window's labelled rows (an image model learns from the images
    `torchship ingest` accepted: the request log keeps no pixels)."""
    if gate.status != "fail":
        return "no drift", [gate.summary()]
    held = []
    if not rules.enabled:
        held.append("retrain.enabled is false: the monitor only reports")
    served_by = set(window.versions())
    if prediction_only and served_by and served_by <= set(retrained_versions):
        held.append("loop protection: only the predictions moved, and the window was served by "
                    f"v{', v'.join(sorted(served_by))} that a retrain produced "
                    "(a new model answers differently; that is not drift of the inputs)")
    mark = high_water(history)
    times = list(window.labelled["ts"]) if labelled_times is None else labelled_times
    new_labels = sum(1 for ts in times if ts > mark)
    if new_labels < rules.min_new_labels:
        already = len(times) - new_labels
        held.append(f"{new_labels} new labelled rows < retrain.min_new_labels {rules.min_new_labels}"
                    + (f" ({already} more were already used by an earlier retrain: loop protection)"
                       if already else ""))
    fired = [d for d in history if d.outcome == "fired"]
    if fired and now - fired[-1].ts < rules.cooldown_minutes * 60:
        wait = rules.cooldown_minutes * 60 - (now - fired[-1].ts)
        held.append(f"cooldown: the last retrain fired {(now - fired[-1].ts) / 60:.1f} min ago "
                    f"(retrain.cooldown_minutes {rules.cooldown_minutes:g}; {wait / 60:.1f} min to go)")
    today = sum(1 for d in fired if utc_day(d.ts) == utc_day(now))
    if today >= rules.max_per_day:
        held.append(f"daily budget: {today} retrain(s) fired today (UTC), retrain.max_per_day {rules.max_per_day}")
    if held:
        return "suppressed", held
    since = f"{(now - fired[-1].ts) / 60:.0f} min since the last retrain" if fired else "no retrain before"
    return "fired", [f"every guard passed: {new_labels} new labelled rows (>= {rules.min_new_labels}), {since}, "
                     f"{today} of {rules.max_per_day} retrains today"]


def make_decision(outcome: Outcome, reasons: list[str], gate: GateResult, window: Window, **extra) -> Decision:
    """A decision on `window`; unless given, its labels run up to the window's newest labelled row."""
    labelled = window.labelled
    extra.setdefault("labels_until", float(labelled["ts"].max()) if len(labelled) else 0.0)
    return Decision(ts=extra.pop("ts", time.time()), outcome=outcome, reasons=reasons, gate=gate,
                    window=window.describe(), **extra)


def last_decisions(where: Path | str, limit: int = 5) -> list[Decision]:
    """For `torchship status`: the newest first."""
    return read_decisions(where)[-limit:][::-1]
