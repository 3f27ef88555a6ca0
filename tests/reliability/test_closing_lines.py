"""A run's closing line says what it did to the registry (the version created, the aliases moved), on success
and at each failure point: before register (a refused file: tests/reliability/test_bad_input.py and
test_contract_doors.py), after register during the canary, and on success. The wording: tests/unit/
test_registry_changes.py."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration
MODEL = "synthetic-churn"


def _said(result) -> str:
    return " ".join((result.stdout + result.stderr).split())     # rich may wrap the line


def test_a_canary_failure_after_register_names_the_version_and_alias_it_left(secret_runs):
    failed = secret_runs.canary_failed
    assert failed.returncode != 0
    said = _said(failed)
    assert "did not become ready" in said                                   # it failed in the canary...
    assert f"Registry: registered v1 of {MODEL}; aliases moved: champion none → v1" in said  # ...after register
    assert "Nothing was registered" not in said and "nothing was registered" not in said
    registry = secret_runs.project.registry(MODEL)
    assert list(registry["versions"]) == ["1"] and registry["aliases"] == {"champion": "1"}


def test_a_successful_run_says_what_it_did_to_the_registry(secret_runs):
    ok = secret_runs.succeeded
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"Registry: no version of {MODEL} was registered; aliases unchanged." in _said(ok)   # same bytes as v1
