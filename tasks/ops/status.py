"""`torchship status` and `torchship rollback`: the registry state of this project's model as typed rows,
and putting the previous champion back."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.config import Params
from tasks.core.errors import TorchshipError
from tasks.core.registry import aliases, registry_client
from tasks.ops.registry import rollback

NOTE_TAGS = ("rejected", "previous", "promoted")


class VersionRow(BaseModel):
    version: str
    aliases: list[str]
    bless: str
    notes: str       # why it was rejected, replaced or promoted
    git_commit: str


class RegistryStatus(BaseModel):
    model_name: str
    aliases: dict[str, str]          # alias -> version
    versions: list[VersionRow]       # newest first


class Rollback(BaseModel):
    model_name: str
    restored: str
    replaced: str
    poll_seconds: float              # running services follow the alias within this


def version_row(version, current: dict[str, str]) -> VersionRow:
    """One registered version (an MLflow ModelVersion) as a row."""
    tags = version.tags
    return VersionRow(version=str(version.version),
                      aliases=[alias for alias, number in current.items() if number == str(version.version)],
                      bless=tags.get("bless", ""),
                      notes="; ".join(f"{key}: {tags[key]}" for key in NOTE_TAGS if key in tags),
                      git_commit=tags.get("git_commit", "")[:10])


def registry_status(params: Params, limit: int = 10) -> RegistryStatus:
    """The newest `limit` versions of the project's registered model, with aliases and verdict tags."""
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    current = aliases(client, name)
    versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))[:limit]
    return RegistryStatus(model_name=name, aliases=current, versions=[version_row(v, current) for v in versions])


def roll_back(params: Params) -> Rollback:
    """Move `champion` back to the version tagged `previous`; the replaced one is tagged rejected."""
    name = params.data.registered_model_name()
    try:
        restored, replaced = rollback(registry_client(params.tracking), name)
    except LookupError as exc:
        raise TorchshipError(str(exc)) from None
    return Rollback(model_name=name, restored=restored, replaced=replaced, poll_seconds=params.serve.poll_seconds)
