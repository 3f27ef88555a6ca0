"""The alias history: every move of `champion` or `challenger`, append-only, as tags of the registered model
(`history.000001`, `history.000002`, ... each one entry as compact JSON).

Why there: the registered model's tags live in the MLflow store that every machine already reaches (the SQLite
file in the embedded default, the tracking server's database in a team), survive restarts, need no new server,
and show in the MLflow UI beside the aliases they explain. Prefect's event log expires; a file on one host is not
shared. One tag per entry, never a rewritten list: appending never loses what another writer appended.

Idempotent: an entry is written only where the history's last known state of an alias differs from the alias
now, under the registry lock (tasks/registry/lock.py: a file lock, or the team's Prefect server), and its
key is the next number in the sequence; two observers that notice the same move therefore write it once (the
second finds it recorded).
Entries have a `kind` so that later decisions (an approval, by a person) join the same sequence."""
from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import socket
import sys
import time

from pydantic import BaseModel

from tasks.registry.lock import alias_lock
from tasks.registry.read import CHALLENGER, CHAMPION, store_busy

log = logging.getLogger("torchship.history")
PREFIX = "history."
ALIASES = (CHAMPION, CHALLENGER)
# MLflow's SQL stores keep a registered-model tag value in a VARCHAR(5000) (PostgreSQL enforces it; SQLite not).
ENTRY_CHARS = 5000
TEXT_CHARS = 1500          # actor, reason and evidence each, so that an entry always fits ENTRY_CHARS
OUTSIDE = "outside torchship"
OUTSIDE_REASON = "moved outside torchship (MLflow UI or API); MLflow records no actor or reason"
BLESSED = {"pass", "warn"}


class HistoryEntry(BaseModel):
    seq: int
    model: str
    alias: str | None = None          # None for an entry that moves no alias (a later approval decision)
    from_version: str | None = None   # None: the alias was not set
    to_version: str | None = None     # None: the alias was removed
    time: str                         # UTC, ISO 8601
    actor: str                        # a torchship command and OS user, a run, or "outside torchship, noticed ..."
    reason: str = ""
    evidence: str = ""                # where the decision's proof lies (bless model card, canary tags and run)
    kind: str = "move"                # move | start (the history's first sight of an alias it did not see move)
    #                                   | approval (a decision on `to_version` that moves no alias itself)

    def key(self) -> str:
        return f"{PREFIX}{self.seq:06d}"

    def value(self) -> str:
        return json.dumps(self.model_dump(exclude_defaults=True), separators=(",", ":"))

    def moved(self) -> str:
        return f"{_v(self.from_version)} → {_v(self.to_version)}"


def _v(version: str | None) -> str:
    return f"v{version}" if version else "none"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def entries_from_tags(tags: dict[str, str]) -> list[HistoryEntry]:
    """The history held in a registered model's tags, oldest first (a tag that is not an entry is skipped)."""
    found = []
    for key, value in tags.items():
        if key.startswith(PREFIX):
            with contextlib.suppress(ValueError):
                found.append(HistoryEntry.model_validate_json(value))
    return sorted(found, key=lambda entry: entry.seq)


def known_aliases(entries: list[HistoryEntry]) -> dict[str, str | None] | None:
    """Who holds each alias by the history (None: not set); None when there is no history yet."""
    moves = [entry for entry in entries if entry.alias in ALIASES]
    if not moves:
        return None
    known: dict[str, str | None] = dict.fromkeys(ALIASES)
    for entry in moves:
        known[entry.alias] = entry.to_version
    return known


def unrecorded(entries: list[HistoryEntry], current: dict[str, str], before: dict[str, str] | None = None
               ) -> list[tuple[str, str | None, str | None, str]]:
    """(alias, from, to, kind) for each alias whose holder differs from the history's last word. With no history
    yet, `before` (the aliases a move started from) is that word; without it, each alias held now is a `start`:
    seen for the first time, its earlier moves unknown."""
    known = known_aliases(entries)
    if known is None and before is not None:
        known = {alias: before.get(alias) for alias in ALIASES}
    if known is None:
        return [(alias, None, current[alias], "start") for alias in ALIASES if alias in current]
    return [(alias, known[alias], current.get(alias), "move") for alias in ALIASES
            if known[alias] != current.get(alias)]


def clip(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "…"


def read_state(client, name: str) -> tuple[list[HistoryEntry], dict[str, str]]:
    """(the history, the aliases now) in one read of the registered model; both empty when it is not registered."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if store_busy(exc):
            raise
        return [], {}
    return entries_from_tags(model.tags), {alias: str(version) for alias, version in model.aliases.items()}


def read_history(client, name: str) -> list[HistoryEntry]:
    return read_state(client, name)[0]


def record_moves(client, name: str, actor: str, reason: str = "", evidence: str = "",
                 before: dict[str, str] | None = None) -> list[HistoryEntry]:
    """Append an entry for each alias that moved since the history's last word (or since `before`, the aliases
    a move started from, on a registry with no history yet), as `actor`'s; returns them. Call it under
    `alias_lock` (the check and the append are then one step for every process)."""
    entries, current = read_state(client, name)
    seq = entries[-1].seq if entries else 0
    written = []
    for alias, old, new, kind in unrecorded(entries, current, before):
        seq += 1
        why = reason if kind == "move" else f"history starts: {alias} already held v{new} (earlier moves unrecorded)"
        entry = HistoryEntry(seq=seq, model=name, alias=alias, from_version=old, to_version=new, time=now(),
                             actor=clip(actor), reason=clip(why), evidence=clip(evidence), kind=kind)
        client.set_registered_model_tag(name, entry.key(), entry.value())   # clipped: within ENTRY_CHARS
        written.append(entry)
    return written


def record_decision(client, name: str, kind: str, actor: str, reason: str, version: str | None = None,
                    evidence: str = "") -> HistoryEntry:
    """Append an entry that moves no alias (e.g. kind "approval": a person's decision on `version`) to the same
    sequence; the aliases' state and rollback read moves only. Call it under `alias_lock`."""
    entries, _ = read_state(client, name)
    entry = HistoryEntry(seq=(entries[-1].seq if entries else 0) + 1, model=name, to_version=version, time=now(),
                         actor=clip(actor), reason=clip(reason), evidence=clip(evidence), kind=kind)
    client.set_registered_model_tag(name, entry.key(), entry.value())
    return entry


def outside_actor(observer: str) -> str:
    return f"{OUTSIDE}, noticed at {now()} by {observer}"


def record_outside_moves(client, name: str, observer: str, lock_wait_s: float | None = None) -> list[HistoryEntry]:
    """Record the moves nobody recorded (the MLflow UI, another process on MLflow's API): MLflow keeps no actor,
    so the entry says who noticed, and when. `lock_wait_s`: None, the registry lock's own default wait."""
    with alias_lock(client, name, lock_wait_s):
        return record_moves(client, name, outside_actor(observer), OUTSIDE_REASON)


def notice_outside_moves(client, name: str, observer: str) -> list[HistoryEntry]:
    """`record_outside_moves` for an observer whose own work must go on whatever happens here (the monitor,
    `torchship status`): a failure (the lock busy, a store this user may only read) is logged, not raised."""
    try:
        return record_outside_moves(client, name, observer)
    except Exception as exc:
        log.warning("the alias history could not be brought up to date (%s): %s", observer, exc)
        return []


def rollback_target(entries: list[HistoryEntry], current: str, rejected: set[str]) -> str | None:
    """The version that was champion before `current` by the history: the newest earlier champion that is
    neither `current` nor rejected (a rolled-back version is no fallback). None when the history cannot say."""
    for entry in reversed(entries):
        if entry.alias == CHAMPION and entry.kind == "move" and entry.from_version \
                and entry.from_version != current and entry.from_version not in rejected:
            return entry.from_version
    return None


def champion_concern(tags: dict[str, str]) -> str | None:
    """Why a champion must not serve unwatched: bless did not pass it (and no re-baseline settled it), or it was
    rejected. A person may have decided so (the MLflow UI, `promote --force`): it serves, and this is raised."""
    if "rejected" in tags:
        return f"rejected: {tags['rejected']}"
    if tags.get("bless") not in BLESSED and "rebaselined" not in tags:
        return f"not blessed (bless: {tags.get('bless') or 'none'})"
    return None


def os_user() -> str:
    """The OS user running this process."""
    try:
        return getpass.getuser()
    except Exception:   # no login name (a container without one): the uid still says who
        return f"uid {os.getuid()}"


def command_actor(command: str) -> str:
    """A by-hand torchship command, with the OS user who ran it."""
    return f"torchship {command} by {os_user()}@{socket.gethostname()}"


def run_actor(kind: str) -> str:
    """A pipeline, retrain or canary run: its Prefect flow run when there is one (read only where Prefect is
    already imported: a plain call never pays for importing it)."""
    flow_run = None
    if "prefect" in sys.modules:
        with contextlib.suppress(Exception):
            from prefect.runtime import flow_run as runtime

            flow_run = runtime.id
    return f"{kind} run {flow_run}" if flow_run else f"{kind} run (no flow run: pid {os.getpid()} on " \
                                                     f"{socket.gethostname()})"
