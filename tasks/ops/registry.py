"""Writing the MLflow registry protocol: aliases `champion` / `challenger`, tags `previous` / `rejected`."""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Iterator

from tasks.core.registry import CHALLENGER, CHAMPION, alias_version

log = logging.getLogger("torchship.registry")
LOCK_WAIT_S = 60.0


@contextlib.contextmanager
def alias_lock(client) -> Iterator[None]:
    """Hold while reading aliases and moving them, so a check-then-move is one step for every process sharing
    the registry: MLflow has no compare-and-set. A SQLite registry (the embedded default) is locked with a file
    beside the database; a tracking server cannot be locked from here, so its moves rest on the re-check the
    callers make just before moving (a window of milliseconds instead of a whole pipeline run)."""
    from filelock import FileLock

    prefix = "sqlite:///"
    uri = client.tracking_uri
    if not uri.startswith(prefix):
        yield
        return
    with FileLock(str(Path(uri[len(prefix):]).with_suffix(".aliases.lock")), timeout=LOCK_WAIT_S):
        yield


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
    """Put the version tagged `previous` back as champion; returns (restored, replaced)."""
    current = alias_version(client, name, CHAMPION)
    previous = [v for v in client.search_model_versions(f"name='{name}'") if "previous" in v.tags]
    if current is None or not previous:
        raise LookupError(f"nothing to roll back to: {name} has no champion or no version tagged 'previous'.")
    target = max(previous, key=lambda v: int(v.version))
    promote(client, name, target.version, f"rollback from v{current.version}")
    client.delete_model_version_tag(name, current.version, "previous")  # a rolled-back version is no fallback
    client.set_model_version_tag(name, current.version, "rejected", f"{_now()}: rolled back by hand")
    return str(target.version), str(current.version)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
