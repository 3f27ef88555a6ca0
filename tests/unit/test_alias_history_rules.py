"""The alias history's pure core (tasks/registry/history.py): what counts as an unrecorded move, which version
a rollback restores, which champion raises a ticket, and entries that always fit one MLflow tag."""
from __future__ import annotations

from tasks.registry.history import (
    ENTRY_CHARS,
    HistoryEntry,
    champion_concern,
    clip,
    entries_from_tags,
    rollback_target,
    unrecorded,
)


def entry(seq: int, alias: str, old: str | None, new: str | None, kind: str = "move") -> HistoryEntry:
    return HistoryEntry(seq=seq, model="m", alias=alias, from_version=old, to_version=new, time="t", actor="a",
                        kind=kind)


def test_a_registry_without_history_starts_it_with_what_each_alias_holds():
    assert unrecorded([], {"champion": "2"}) == [("champion", None, "2", "start")]
    assert unrecorded([], {}) == []
    # torchship's own first move on a registry without history: from what the aliases were before it
    assert unrecorded([], {"champion": "1"}, before={}) == [("champion", None, "1", "move")]
    assert unrecorded([], {"champion": "2"}, before={"champion": "1"}) == [("champion", "1", "2", "move")]


def test_only_aliases_that_differ_from_the_history_are_unrecorded():
    history = [entry(1, "champion", None, "1"), entry(2, "challenger", None, "2"), entry(3, "champion", "1", "2"),
               entry(4, "challenger", "2", None)]
    assert unrecorded(history, {"champion": "2"}) == []
    assert unrecorded(history, {"champion": "3"}) == [("champion", "2", "3", "move")]
    assert unrecorded(history, {"champion": "2", "challenger": "5"}) == [("challenger", None, "5", "move")]
    assert unrecorded(history, {}) == [("champion", "2", None, "move")]


def test_rollback_restores_the_champion_before_the_current_one_by_the_history():
    # v1 first, the canary promoted v2, a reviewer moved the champion to v3 in the MLflow UI
    history = [entry(1, "champion", None, "1"), entry(2, "champion", "1", "2"), entry(3, "champion", "2", "3")]
    assert rollback_target(history, "3", rejected=set()) == "2"     # not v1, which `previous` would name
    # rolled back: v3 is rejected; a second rollback goes further back, never to the rejected v3
    after = [*history, entry(4, "champion", "3", "2")]
    assert rollback_target(after, "2", rejected={"3"}) == "1"
    assert rollback_target(after, "2", rejected={"3", "1"}) is None
    # the history's first sight of an alias names no earlier champion: the caller falls back to `previous`
    assert rollback_target([entry(1, "champion", None, "2", kind="start")], "2", rejected=set()) is None
    assert rollback_target([entry(1, "challenger", "4", "5")], "5", rejected=set()) is None


def test_an_unblessed_or_rejected_champion_is_a_concern_and_a_blessed_or_rebaselined_one_is_not():
    assert champion_concern({"bless": "pass"}) is None and champion_concern({"bless": "warn"}) is None
    assert champion_concern({"bless": "fail", "rebaselined": "new columns"}) is None
    assert "not blessed (bless: fail)" in champion_concern({"bless": "fail"})
    assert "not blessed (bless: none)" in champion_concern({})
    assert champion_concern({"bless": "pass", "rejected": "rolled back by hand"}) == "rejected: rolled back by hand"


def test_entries_round_trip_through_tags_in_order_and_always_fit_one_tag():
    long = HistoryEntry(seq=10, model="m", alias="champion", from_version="9", to_version="10", time="t",
                        actor="a" * 3000, reason="r" * 20_000, evidence="e" * 20_000)
    clipped = long.model_copy(update={field: clip(getattr(long, field)) for field in ("actor", "reason", "evidence")})
    assert len(clipped.value()) <= ENTRY_CHARS
    ninth = entry(9, "champion", "8", "9")
    tags = {clipped.key(): clipped.value(), ninth.key(): ninth.value(),
            "baseline": "v3: not an entry", "history.broken": "{not json"}
    assert [e.seq for e in entries_from_tags(tags)] == [9, 10]
    assert entries_from_tags(tags)[1].reason.startswith("rrr") and clipped.key() == "history.000010"
