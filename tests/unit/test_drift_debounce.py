"""prefect.yaml's retrain trigger (run against a real server in tests/integration/test_drift_trigger.py): a
debounce Prefect accepts, per model, as long as the retrain cooldown, under the name the drift runbook pauses."""
from __future__ import annotations

import yaml

from tasks.config import load_params
from tests.conftest import REPO


def retrain_trigger() -> dict:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
    [retrain] = [d for d in deployments if d["name"] == "retrain"]
    [trigger] = retrain["triggers"]
    return trigger


def test_the_retrain_trigger_fires_once_per_model_per_cooldown():
    from prefect.events import DeploymentEventTrigger

    trigger = DeploymentEventTrigger(**retrain_trigger())
    assert trigger.posture == "Reactive" and trigger.threshold == 1
    assert trigger.for_each == {"prefect.resource.id"}
    cooldown = load_params(REPO / "params.yaml").retrain.cooldown_minutes
    assert trigger.within.total_seconds() == cooldown * 60, "prefect.yaml's `within` is retrain.cooldown_minutes"


def test_the_drift_runbook_pauses_the_trigger_by_its_name():
    runbook = (REPO / "docs" / "runbooks.md").read_text(encoding="utf-8")
    name = retrain_trigger()["name"]
    assert f"prefect automation pause {name}" in runbook and f"prefect automation resume {name}" in runbook
