"""Alias moves when several processes share one registry: no lost update. A real SQLite MLflow registry and
real processes; no pipeline needed. (What another process moved shows in `torchship status`: see
tests/integration/test_cli_inprocess.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.core.gate import GateResult
from tasks.core.params_spec import Params
from tasks.core.verdicts import Blessing, BlessOutcome, RegistrationOutcome
from tasks.register import apply_aliases
from tasks.registry.read import CHALLENGER, CHAMPION, aliases, registry_client

pytestmark = pytest.mark.integration
NAME = "race"
REPO = Path(__file__).resolve().parents[2]


def blessed(champion: str | None) -> Blessing:
    return Blessing(gate=GateResult.decide("bless", []), outcome=BlessOutcome.BETTER, model_name=NAME,
                    candidate_path="model.onnx", candidate_sha256="0" * 64, candidate_metrics={"f1_macro": 0.9},
                    champion_version=champion)


@pytest.fixture()
def registry(tmp_path):
    params = Params.model_validate({"data": {"model_name": NAME},
                                    "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}})
    client = registry_client(params.tracking)
    client.create_registered_model(NAME)
    for _ in range(3):
        client.create_model_version(NAME, source=str(tmp_path))
    return params, client


RACER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tests.integration.test_registry_races import NAME, blessed
    from tasks.core.params_spec import TrackingParams
    from tasks.registry.read import registry_client
    from tasks.register import apply_aliases
    uri, version, go = sys.argv[1:]
    client = registry_client(TrackingParams(uri=uri))
    client.search_model_versions(f"name='{NAME}'")          # warm: both racers start from the same line
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    print(json.dumps(apply_aliases(client, NAME, version, blessed(None))))
""")


def test_two_registrations_at_once_lose_no_update(registry, tmp_path):
    """Both pipelines blessed against 'no champion' and register at the same moment: one becomes champion, the
    other keeps no alias and says why; neither action is overwritten by the other."""
    params, client = registry
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, params.tracking.resolved_uri(), version, str(go)],
                               cwd=REPO, stdout=subprocess.PIPE, text=True) for version in ("1", "2")]
    assert [racer.stdout.readline().strip() for racer in racers] == ["ready", "ready"]
    go.touch()   # both processes are parked at the start line: release them together
    actions = [json.loads(racer.communicate(timeout=60)[0]) for racer in racers]   # [outcome, in words]
    winners = [action for outcome, action in actions if outcome == RegistrationOutcome.CHAMPION]
    losers = [action for outcome, action in actions if outcome == RegistrationOutcome.STALE]
    assert len(winners) == 1 and len(losers) == 1, actions
    winner = winners[0].split()[0].lstrip("v")
    assert aliases(client, NAME) == {CHAMPION: winner}
    loser = "2" if winner == "1" else "1"
    assert f"champion moved to v{winner}" in losers[0] and "re-run `torchship run`" in losers[0]
    assert "stale" in client.get_model_version(NAME, loser).tags


def test_a_champion_moved_after_bless_keeps_the_new_version_off_the_aliases(registry):
    params, client = registry
    client.set_registered_model_alias(NAME, CHAMPION, "1")
    client.set_registered_model_alias(NAME, CHAMPION, "2")          # another pipeline's canary promoted v2
    outcome, action = apply_aliases(client, NAME, "3", blessed("1"))
    assert outcome is RegistrationOutcome.STALE and "v2" in action
    assert aliases(client, NAME) == {CHAMPION: "2"}
    client.set_registered_model_alias(NAME, CHALLENGER, "1")        # a canary in flight elsewhere
    outcome, action = apply_aliases(client, NAME, "3", blessed("2"))
    assert outcome is RegistrationOutcome.STALE and "v1 holds `challenger`" in action
    assert aliases(client, NAME) == {CHAMPION: "2", CHALLENGER: "1"}
    client.delete_registered_model_alias(NAME, CHALLENGER)
    assert apply_aliases(client, NAME, "3", blessed("2")) == (RegistrationOutcome.CHALLENGER,
                                                              "v3 is challenger; the canary decides")

