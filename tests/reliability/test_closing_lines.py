"""A run's closing line says what it did to the registry (the version created, the aliases moved), on success
and at each failure point: before register (a refused file: test_bad_input.py and test_contract_doors.py),
after register during the canary (here), and on success (tests/integration/test_pipeline.py: a first run and
a run that registers nothing). The wording: tests/unit/test_registry_changes.py."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration
MODEL = "synthetic-churn"


def _said(result) -> str:
    return " ".join((result.stdout + result.stderr).split())     # rich may wrap the line


@pytest.mark.xdist_group("canary_failure")   # one worker runs the failing pipeline (tests/reliability/conftest.py)
def test_a_canary_failure_after_register_names_the_version_and_alias_it_left(canary_failure):
    failed = canary_failure.failed
    assert failed.returncode != 0
    said = _said(failed)
    assert "did not become ready" in said                                   # it failed in the canary...
    assert f"Registry: registered v1 of {MODEL}; aliases moved: champion none → v1" in said  # ...after register
    assert "Nothing was registered" not in said and "nothing was registered" not in said
    registry = canary_failure.project.registry(MODEL)
    assert list(registry["versions"]) == ["1"] and registry["aliases"] == {"champion": "1"}
