"""`torchship status` and `torchship history`: the registry state of this project's model as typed rows, its alias
history, and a run's registry changes in words. No alias moves here (those are in `tasks.registry.moves`); the
writes are the history's: moves nobody recorded (the MLflow UI) are recorded when status or history sees them, and
approval decisions made in the MLflow UI or timed out are acted on (tasks/registry/approvals.py)."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.core.params_spec import Params
from tasks.core.verdicts import OUTCOME_TAG
from tasks.registry.approvals import ApprovalAction, Waiting, review_quietly
from tasks.registry.history import HistoryEntry, champion_concern, command_actor, notice_outside_moves, read_history
from tasks.registry.notifications import champion_notice, notify_once
from tasks.registry.read import UNFINISHED_TAG, aliases, registry_client

NOTE_TAGS = ("approval", "rejected", "previous", "promoted", "stale", "rebaselined", UNFINISHED_TAG)
HISTORY_SHOWN = 5   # the last entries `torchship status` shows (`torchship history` shows all)


class VersionRow(BaseModel):
    version: str
    aliases: list[str]
    bless: str       # pass | warn | fail, and bless's outcome (e.g. "fail: incomparable": rebaseline takes it)
    notes: str       # why it was rejected, replaced or promoted
    git_commit: str


class RegistryStatus(BaseModel):
    model_name: str
    aliases: dict[str, str]          # alias -> version
    versions: list[VersionRow]       # newest first
    history: list[HistoryEntry] = []  # the alias history's last entries, oldest first
    champion_concern: str | None = None   # why the champion should not serve unwatched (unblessed, rejected)
    approvals: list[ApprovalAction] = []  # decisions this look acted on (an MLflow UI tag, a timeout)
    waiting: list[Waiting] = []           # versions awaiting a person's approval


def version_row(version, current: dict[str, str]) -> VersionRow:
    """One registered version (an MLflow ModelVersion) as a row."""
    tags = version.tags
    return VersionRow(version=str(version.version),
                      aliases=[alias for alias, number in current.items() if number == str(version.version)],
                      bless=": ".join(tags[key] for key in ("bless", OUTCOME_TAG) if tags.get(key)),
                      notes="; ".join(f"{key}: {tags[key]}" for key in NOTE_TAGS if key in tags),
                      git_commit=tags.get("git_commit", "")[:10])


def registry_status(params: Params, limit: int = 10) -> RegistryStatus:
    """The newest `limit` versions of the project's registered model, with aliases and verdict tags."""
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    notice_outside_moves(client, name, command_actor("status"))
    acted, waiting = review_quietly(params, command_actor("status"))
    current = aliases(client, name)
    found = client.search_model_versions(f"name='{name}'")
    champion = next((v for v in found if str(v.version) == current.get("champion")), None)
    versions = sorted(found, key=lambda v: -int(v.version))[:limit]
    concern = champion_concern(champion.tags) if champion else None
    if concern:
        notify_once(client, champion_notice(name, current["champion"], concern), params.notify)
    return RegistryStatus(model_name=name, aliases=current, versions=[version_row(v, current) for v in versions],
                          history=read_history(client, name)[-HISTORY_SHOWN:], champion_concern=concern,
                          approvals=acted, waiting=waiting)


def alias_history(params: Params, model_name: str | None = None) -> tuple[str, list[HistoryEntry]]:
    """(model name, its whole alias history, oldest first): the project's model unless another is named."""
    name = model_name or params.data.registered_model_name()
    client = registry_client(params.tracking)
    notice_outside_moves(client, name, command_actor("history"))
    return name, read_history(client, name)


class RegistrySnapshot(BaseModel):
    """The versions and aliases of one registered model at a moment: a run's closing line compares two."""

    model_name: str
    versions: list[str] = []
    aliases: dict[str, str] = {}


def registry_snapshot(params: Params) -> RegistrySnapshot:
    """What the registry holds now for the project's model (empty when it cannot be read: the line then says so)."""
    name = params.data.registered_model_name()
    try:
        client = registry_client(params.tracking)
        versions = [str(v.version) for v in client.search_model_versions(f"name='{name}'")]
        return RegistrySnapshot(model_name=name, versions=versions, aliases=aliases(client, name))
    except Exception:   # a store that cannot be opened: nothing to compare, never a second error
        return RegistrySnapshot(model_name=name)


def registry_changes(before: RegistrySnapshot, after: RegistrySnapshot) -> str:
    """In words, what happened to the registry between two snapshots: versions created and aliases moved."""
    created = sorted(set(after.versions) - set(before.versions), key=int)
    moved = [f"{alias} {_held(before, alias)} → {_held(after, alias)}"
             for alias in sorted(set(before.aliases) | set(after.aliases))
             if before.aliases.get(alias) != after.aliases.get(alias)]
    made = (f"registered {', '.join('v' + v for v in created)} of {after.model_name}" if created
            else f"no version of {after.model_name} was registered")
    return f"{made}; " + (f"aliases moved: {', '.join(moved)}" if moved else "aliases unchanged")


def _held(snapshot: RegistrySnapshot, alias: str) -> str:
    return f"v{snapshot.aliases[alias]}" if alias in snapshot.aliases else "none"
