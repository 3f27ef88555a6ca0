"""A flow run whose process dies with its machine (SIGKILL, power, a worker host gone) never reports its end: Prefect
keeps it Running for good, and a deployment's concurrency slot with it. Every flow run sends a heartbeat event every
PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (every torchship command and prefect.yaml's job env set HEARTBEAT_S,
Prefect's minimum: tasks/core/env.py); the automation `torchship-crash-watch`, which `torchship deploy` creates on
the server, marks a torchship flow run Crashed when no heartbeat and no final state followed its last heartbeat
within SILENCE_S (Prefect's recipe for "zombie" flow runs, read in Prefect 3.9.1: a proactive trigger, evaluated
every 5 s by default).

The bound (`crashed_within_s`): the last heartbeat came at most HEARTBEAT_S before the death, so the run is Crashed
at most HEARTBEAT_S + SILENCE_S + the evaluation interval after it. The locks it held need no watch: their leases
end within `prefect_limits.dead_holder_bound_s` of the death, which is shorter."""
from __future__ import annotations

HEARTBEAT_S = 30            # Prefect refuses less; JOB_ENV (tasks/core/env.py) sends it, a unit test checks
SILENCE_S = 3 * HEARTBEAT_S  # two missed heartbeats are not yet a death: a busy 2-core box delays one
EVALUATION_S = 5            # PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY's default
AUTOMATION = "torchship-crash-watch"
FINAL = ("Completed", "Failed", "Cancelled", "Crashed")


def crashed_within_s() -> float:
    """The longest a dead torchship flow run stays Running."""
    return HEARTBEAT_S + SILENCE_S + EVALUATION_S


def automation_spec() -> dict:
    """The automation, as `prefect automation create --from-json` reads it. Only torchship's flows (named
    torchship-*): another flow on the server may beat its heart less often than SILENCE_S."""
    return {
        "name": AUTOMATION,
        "description": f"Marks a torchship flow run Crashed when its process stopped sending heartbeats "
                       f"(every {HEARTBEAT_S} s) for {SILENCE_S} s: the worker's machine died.",
        "enabled": True,
        "trigger": {
            "type": "event", "posture": "Proactive",
            "match": {"prefect.resource.id": "prefect.flow-run.*"},
            "match_related": {"prefect.resource.role": "flow", "prefect.resource.name": "torchship-*"},
            "after": ["prefect.flow-run.heartbeat"],
            "expect": ["prefect.flow-run.heartbeat", *(f"prefect.flow-run.{state}" for state in FINAL)],
            "for_each": ["prefect.resource.id"], "threshold": 1, "within": SILENCE_S,
        },
        "actions": [{"type": "change-flow-run-state", "state": "CRASHED",
                     "message": f"no heartbeat for {SILENCE_S} s: the process running this flow run died "
                                f"({AUTOMATION})"}],
    }
