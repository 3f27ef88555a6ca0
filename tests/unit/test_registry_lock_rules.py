"""Which registry lock a tracking URI gets, the Prefect limit's name per model, and what the refusals say (no server
here: tests/integration/test_registry_lock.py takes the lock on real ones)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.core.prefect_limits import LEASE_S, REPOSSESSOR_LOOP_S, dead_holder_bound_s
from tasks.registry.lock import (
    FILE,
    SERVER,
    UNLOCKED,
    RegistryLockError,
    alias_lock,
    busy_message,
    limit_name,
    lock_kind,
    no_server_message,
)


@pytest.mark.parametrize(("uri", "kind"), [
    ("sqlite:////work/project/mlflow/mlflow.db", FILE),
    ("http://127.0.0.1:5000", SERVER),
    ("https://bob:pw@mlflow.team.example", SERVER),
    ("postgresql+psycopg2://torchship@db:5432/mlflow", SERVER),   # a shared database is shared like a server
    ("file:///work/project/mlruns", UNLOCKED),                    # MLflow's local file store, unlocked as ever
    ("./mlruns", UNLOCKED),
])
def test_the_lock_follows_where_the_registry_is(uri, kind):
    assert lock_kind(uri) == kind


def test_one_limit_per_model_and_names_a_limit_may_hold():
    assert limit_name("tabular-default") == "torchship-registry-tabular-default"
    odd = limit_name("sales/2026 eu")
    assert odd.startswith("torchship-registry-sales-2026-eu-") and not set("/%&<> ") & set(odd)
    assert odd != limit_name("sales-2026 eu") != limit_name("sales-2026-eu")   # no two models share a limit


def test_the_refusal_says_what_to_set_and_shows_no_password():
    message = no_server_message("fraud", "https://bob:hunter2@mlflow.team.example:5000")
    assert "PREFECT_API_URL" in message and "torchship-registry-fraud" in message and "Nothing was moved" in message
    assert "https://mlflow.team.example:5000" in message and "hunter2" not in message and "bob" not in message


def test_a_wait_that_runs_out_names_the_model_the_limit_and_the_way_out():
    message = busy_message("fraud", "http://prefect.team.example:4200/api", 120)
    assert "fraud" in message and "torchship-registry-fraud" in message and "stayed taken for 120 s" in message
    assert "prefect gcl update torchship-registry-fraud --active-slots 0" in message
    assert f"{dead_holder_bound_s():.0f} s" in message


def test_the_dead_holder_bound_is_the_lease_and_the_repossessor():
    assert LEASE_S + REPOSSESSOR_LOOP_S < dead_holder_bound_s() < LEASE_S + REPOSSESSOR_LOOP_S + 1


def test_a_server_registry_without_a_prefect_server_refuses_before_anything_moves():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    client = SimpleNamespace(tracking_uri="http://127.0.0.1:5000")   # nothing is asked of it: refused first
    entered = False
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(RegistryLockError, match="refused"), \
            alias_lock(client, "fraud"):
        entered = True
    assert not entered


def test_the_local_file_store_stays_unlocked():
    with alias_lock(SimpleNamespace(tracking_uri="file:///tmp/mlruns"), "fraud", timeout=0):
        pass
