"""A run's closing line says what really happened to the registry (which version was created, which aliases
moved), on failure too: a failure after register leaves a version behind."""
from __future__ import annotations

from types import SimpleNamespace

from tasks.registry.status import RegistrySnapshot, registry_changes, version_row


def snap(versions: list[str], **aliases: str) -> RegistrySnapshot:
    return RegistrySnapshot(model_name="churn", versions=versions, aliases=aliases)


def test_a_failure_before_register_changed_nothing():
    assert registry_changes(snap(["1"], champion="1"), snap(["1"], champion="1")) == (
        "no version of churn was registered; aliases unchanged")


def test_a_failure_after_register_names_the_version_and_the_alias_it_took():
    said = registry_changes(snap(["1"], champion="1"), snap(["1", "2"], champion="1", challenger="2"))
    assert said == "registered v2 of churn; aliases moved: challenger none → v2"


def test_a_promotion_and_a_first_model_are_named():
    assert registry_changes(snap([]), snap(["1"], champion="1")) == (
        "registered v1 of churn; aliases moved: champion none → v1")
    assert registry_changes(snap(["1", "2"], champion="1", challenger="2"), snap(["1", "2"], champion="2")) == (
        "no version of churn was registered; aliases moved: challenger v2 → none, champion v1 → v2")


def test_a_status_row_shows_bless_verdict_with_its_outcome():
    refused = SimpleNamespace(version=3, tags={"bless": "fail", "bless_outcome": "incomparable", "rejected": "bless"})
    row = version_row(refused, {"champion": "2"})
    assert row.bless == "fail: incomparable" and row.aliases == [] and row.notes == "rejected: bless"
    older = SimpleNamespace(version=2, tags={"bless": "pass"})   # registered before outcomes were recorded
    assert version_row(older, {"champion": "2"}).bless == "pass"
