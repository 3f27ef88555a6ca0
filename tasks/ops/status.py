"""`torchship status` and `torchship rollback`: the registry state of this project's model as typed rows,
and putting the previous champion back."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.config import Params
from tasks.core.errors import TorchshipError
from tasks.core.registry import aliases, registry_client
from tasks.ops.registry import promote, rollback

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


class Promotion(BaseModel):
    model_name: str
    promoted: str
    replaced: str | None
    forced: bool
    poll_seconds: float              # running services follow the alias within this


def promote_version(params: Params, version: str, reason: str, force: bool = False) -> Promotion:
    """Move `champion` to `version` by hand, with a recorded reason; a version bless did not pass is refused
    unless `force` (then the reason is recorded as the override)."""
    name = params.data.registered_model_name()
    if not reason.strip():
        raise TorchshipError("say why: torchship promote VERSION --reason \"...\" (recorded on the version)")
    client = registry_client(params.tracking)
    from mlflow.exceptions import MlflowException

    try:
        found = client.get_model_version(name, str(version))
    except MlflowException:
        raise TorchshipError(f"{name} has no version {version}: see `torchship status`.") from None
    verdict = found.tags.get("bless", "")
    if verdict not in {"pass", "warn"} and not force:
        why = found.tags.get("bless_reasons", "no blessing recorded")
        raise TorchshipError(f"v{version} of {name} was not blessed (bless: {verdict or 'none'}: {why}). "
                             f"Promote it anyway only with --force and a --reason, which is recorded on the version.")
    if force and verdict not in {"pass", "warn"}:
        client.set_model_version_tag(name, str(version), "forced", reason)
    replaced = promote(client, name, str(version), f"by hand{' (forced)' if force else ''}: {reason}")
    return Promotion(model_name=name, promoted=str(version), replaced=replaced, forced=force and verdict not in
                     {"pass", "warn"}, poll_seconds=params.serve.poll_seconds)


def roll_back(params: Params) -> Rollback:
    """Move `champion` back to the version tagged `previous`; the replaced one is tagged rejected."""
    name = params.data.registered_model_name()
    try:
        restored, replaced = rollback(registry_client(params.tracking), name)
    except LookupError as exc:
        raise TorchshipError(str(exc)) from None
    return Rollback(model_name=name, restored=restored, replaced=replaced, poll_seconds=params.serve.poll_seconds)
