"""Writing the MLflow registry protocol: aliases `champion` / `challenger`, tags `previous` / `rejected`, and each
move in the alias history (tasks/registry/history.py) under the same lock."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from tasks.registry.history import (
    OUTSIDE_REASON,
    HistoryEntry,
    outside_actor,
    read_history,
    record_moves,
    rollback_target,
)
from tasks.registry.lock import alias_lock
from tasks.registry.read import CHALLENGER, CHAMPION, alias_version, aliases

log = logging.getLogger("torchship.registry")
__all__ = ["alias_lock", "promote", "recorded_move", "reject", "rollback"]   # alias_lock: the writers' import


class Move:
    """What a `recorded_move` block did and why: the block fills in the reason once it knows it."""

    def __init__(self, actor: str, reason: str = "", evidence: str = ""):
        self.actor, self.reason, self.evidence = actor, reason, evidence
        self.recorded: list[HistoryEntry] = []


@contextlib.contextmanager
def recorded_move(client, name: str, actor: str, reason: str = "", evidence: str = "") -> Iterator[Move]:
    """The registry's alias lock, with the history kept: moves nobody recorded (the MLflow UI) are recorded first,
    as noticed now by `actor`; then whatever the block moved is recorded as `actor`'s, with the block's reason."""
    move = Move(actor, reason, evidence)
    with alias_lock(client, name):
        record_moves(client, name, outside_actor(actor), OUTSIDE_REASON)
        before = aliases(client, name)   # what the history now says (a first move starts an empty history)
        try:
            yield move
        except BaseException:   # what moved before the error is still this actor's, not "outside torchship"
            with contextlib.suppress(Exception):
                record_moves(client, name, move.actor, f"{move.reason} (interrupted by an error)", move.evidence,
                             before)
            raise
        move.recorded = record_moves(client, name, move.actor, move.reason, move.evidence, before)


def promote(client, name: str, version: str, reason: str) -> str | None:
    """Move `champion` to `version`; the old champion is tagged `previous`. Returns the old version."""
    old = alias_version(client, name, CHAMPION)
    for other in client.search_model_versions(f"name='{name}'"):
        if "previous" in other.tags:
            client.delete_model_version_tag(name, other.version, "previous")
    if old is not None and str(old.version) != str(version):
        client.set_model_version_tag(name, old.version, "previous", f"replaced by v{version} at {_now()}")
    client.set_registered_model_alias(name, CHAMPION, version)
    client.set_model_version_tag(name, version, "promoted", f"{_now()}: {reason}")
    if (challenger := alias_version(client, name, CHALLENGER)) and str(challenger.version) == str(version):
        client.delete_registered_model_alias(name, CHALLENGER)
    log.info("%s v%s is champion (%s)", name, version, reason)
    return str(old.version) if old is not None else None


def reject(client, name: str, version: str, reason: str) -> None:
    """Take `challenger` off a version and record why; the champion is untouched."""
    if (challenger := alias_version(client, name, CHALLENGER)) and str(challenger.version) == str(version):
        client.delete_registered_model_alias(name, CHALLENGER)
    client.set_model_version_tag(name, version, "rejected", f"{_now()}: {reason}")
    log.info("%s v%s rejected: %s", name, version, reason)


def rollback(client, name: str) -> tuple[str, str]:
    """Put back the version that was champion before the current one, by the alias history (the newest earlier
    champion neither current nor rejected); with no history to say, the version tagged `previous`. The replaced
    one is tagged rejected. Returns (restored, replaced). Call it under the lock, after outside moves are recorded."""
    current = alias_version(client, name, CHAMPION)
    if current is None:
        raise LookupError(f"nothing to roll back to: {name} has no champion.")
    versions = client.search_model_versions(f"name='{name}'")
    rejected = {str(v.version) for v in versions if "rejected" in v.tags}
    target = rollback_target(read_history(client, name), str(current.version), rejected)
    if target is None:
        previous = [v for v in versions if "previous" in v.tags]
        if not previous:
            raise LookupError(f"nothing to roll back to: the history of {name} names no earlier champion that was "
                              "not rejected, and no version is tagged 'previous'.")
        target = str(max(previous, key=lambda v: int(v.version)).version)
    promote(client, name, target, f"rollback from v{current.version}")
    client.delete_model_version_tag(name, current.version, "previous")  # a rolled-back version is no fallback
    client.set_model_version_tag(name, current.version, "rejected", f"{_now()}: rolled back by hand")
    return target, str(current.version)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
