"""The automation that marks a dead machine's flow run Crashed (tasks/workspace/crash_watch.py): Prefect's own model
accepts it, it watches only torchship's flows, and the heartbeat it counts on is the one deployed runs send."""
from __future__ import annotations

from tasks.core.env import HEARTBEAT_ENV, JOB_ENV, QUIET
from tasks.workspace import crash_watch


def test_prefect_accepts_the_automation_and_it_crashes_only_silent_torchship_runs():
    from prefect.events.schemas.automations import AutomationCore, Posture

    automation = AutomationCore.model_validate(crash_watch.automation_spec())
    trigger = automation.trigger
    assert trigger.posture == Posture.Proactive and trigger.within.total_seconds() == crash_watch.SILENCE_S
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= trigger.expect
    assert automation.actions[0].type == "change-flow-run-state" and automation.actions[0].state.value == "CRASHED"
    assert crash_watch.automation_spec()["trigger"]["match_related"]["prefect.resource.name"] == "torchship-*"


def test_every_run_sends_the_heartbeat_the_watch_counts_on():
    assert JOB_ENV[HEARTBEAT_ENV] == QUIET[HEARTBEAT_ENV] == str(crash_watch.HEARTBEAT_S)   # deployed runs, and CLI
    assert crash_watch.SILENCE_S >= 2 * crash_watch.HEARTBEAT_S   # one late heartbeat is no death
    assert crash_watch.crashed_within_s() == crash_watch.HEARTBEAT_S + crash_watch.SILENCE_S + 5
