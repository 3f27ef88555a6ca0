"""The approval form: the `review` deployment's run form in the Prefect UI (Deployments -> review -> Run -> Custom
run) asks for the version, approve or reject, the reviewer and why, as `torchship approve|reject` does in a shell.
An approval starts a run of the `canary` deployment and this run ends: no paused run is held open while a person
decides, so a decision days later costs nothing and survives a server restart."""
from __future__ import annotations

from typing import Literal

from prefect import flow

from flows.environment import server_configured
from tasks.config import load_params
from tasks.core.errors import TorchshipError
from tasks.registry.approvals import decide_by_hand

CANARY_DEPLOYMENT = "torchship-canary/canary"
DECIDED = {"approve": "approved", "reject": "rejected"}


def form_actor() -> str:
    """Who acted, for the alias history: the form, and its flow run when there is one."""
    from prefect.runtime import flow_run

    return f"the Prefect UI form (flow run {flow_run.name})" if flow_run.id else "the Prefect UI form"


def start_canary(params_file: str) -> str:
    """On a server: a run of the `canary` deployment, not waited for. Without one (a plain call): the canary here."""
    if server_configured():
        from prefect.deployments import run_deployment

        started = run_deployment(CANARY_DEPLOYMENT, parameters={"params_file": params_file}, timeout=0)
        return f"canary started: flow run {started.name} of {CANARY_DEPLOYMENT}"
    from flows.canary import canary_flow

    return f"canary: {canary_flow(params_file=params_file).action}"


@flow(name="torchship-review", log_prints=True)
def review(version: str, decision: Literal["approve", "reject"], reviewer: str, reason: str,
           params_file: str = "params.yaml") -> str:
    """Approve or reject a version awaiting approval (promotion.approval: required); an approval takes `challenger`
    and starts its canary. The form shows the arguments' help below.

    Args:
        version: The registered version awaiting approval (`torchship status` lists them).
        decision: approve: it takes `challenger` and its canary starts; reject: tagged rejected, never canaried.
        reviewer: Your name: the person recorded in the alias history.
        reason: Why: recorded in the alias history (and on the version when rejected).
        params_file: The project's params file, relative to the deployment's working directory.
    """
    if not reviewer.strip():   # the person is what the alias history is for: an anonymous decision is refused
        raise TorchshipError("say who decides: fill in `reviewer` with your name (recorded in the alias history)")
    params = load_params(params_file)
    done = decide_by_hand(params, version, DECIDED[decision], reason, form_actor(), reviewer.strip())
    print(done.action)
    if done.canary_due:
        print(start_canary(params_file))
    return done.action
