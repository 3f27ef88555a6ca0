"""The retrain trigger's notifications: a retrain fired, and retrains began to be suppressed (the first suppression
after anything else; a run of suppressions is one state, one notification)."""
from __future__ import annotations

from pathlib import Path

from tasks.core.params_spec import Params
from tasks.monitoring.guards import Decision, read_decisions
from tasks.registry.notifications import Notice, notify_once
from tasks.registry.read import registry_client


def decision_notice(model: str, decision: Decision, earlier: list[Decision]) -> Notice | None:
    """The notice a trigger decision makes, keyed by the state it reports; None for no drift or a retrain done."""
    why = "; ".join(decision.reasons)
    if decision.outcome == "fired":
        return Notice(event="retrain-fired", key=f"{decision.ts:.3f}", model=model,
                      text=f"{model}: drift fired a retrain: {why}")
    if decision.outcome == "suppressed":
        began = next((d.ts for d in reversed(earlier) if d.outcome != "suppressed"), 0.0)
        return Notice(event="retrain-suppressed", key=f"after-{began:.3f}", model=model,
                      text=f"{model}: a retrain was suppressed (later ones are not notified until a decision "
                           f"other than suppressed): {why}")
    return None


def announce_decision(params: Params, decision: Decision, decisions: Path | str) -> str | None:
    """Send `decision`'s notice (it is the last one recorded in `decisions`), once."""
    earlier = [d for d in read_decisions(decisions) if d.ts < decision.ts]
    notice = decision_notice(params.data.registered_model_name(), decision, earlier)
    if notice is None:
        return None
    return notify_once(registry_client(params.tracking), notice, params.notify)
