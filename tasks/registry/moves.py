"""`torchship promote`, `rollback` and `rebaseline`: the by-hand moves of the `champion` alias, each under the
registry's alias lock, recorded on the version (the reason given, and what it replaced) and in the alias history
(the command and the OS user who ran it)."""
from __future__ import annotations

from pydantic import BaseModel

from tasks.core.errors import TorchshipError
from tasks.core.params_spec import Params
from tasks.core.verdicts import OUTCOME_TAG, BlessOutcome
from tasks.registry.history import command_actor
from tasks.registry.read import model_version, registry_client
from tasks.registry.write import promote, recorded_move, rollback


class Rollback(BaseModel):
    model_name: str
    restored: str
    replaced: str
    poll_seconds: float              # running services follow the alias within this


class Promotion(BaseModel):
    model_name: str
    promoted: str
    replaced: str | None
    forced: bool
    poll_seconds: float              # running services follow the alias within this


def requested_version(params: Params, version: str, reason: str, command: str):
    """(model name, registry client, the version) for a by-hand alias move, which must say why."""
    if not reason.strip():
        raise TorchshipError(f"say why: torchship {command} VERSION --reason \"...\" (recorded on the version)")
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    return name, client, model_version(client, name, version)


def promote_version(params: Params, version: str, reason: str, force: bool = False) -> Promotion:
    """Move `champion` to `version` by hand, with a recorded reason; a version bless did not pass is refused
    unless `force` (then the reason is recorded as the override)."""
    name, client, found = requested_version(params, version, reason, "promote")
    verdict = found.tags.get("bless", "")
    if verdict not in {"pass", "warn"} and not force:
        why = found.tags.get("bless_reasons", "no blessing recorded")
        raise TorchshipError(f"v{version} of {name} was not blessed (bless: {verdict or 'none'}: {why}). "
                             f"Promote it anyway only with --force and a --reason, which is recorded on the version.")
    why = f"by hand{' (forced)' if force else ''}: {reason}"
    with recorded_move(client, name, command_actor("promote"), why, evidence(found)):
        if force and verdict not in {"pass", "warn"}:
            client.set_model_version_tag(name, str(version), "forced", reason)
        replaced = promote(client, name, str(version), why)
    return Promotion(model_name=name, promoted=str(version), replaced=replaced, forced=force and verdict not in
                     {"pass", "warn"}, poll_seconds=params.serve.poll_seconds)


def evidence(version) -> str:
    """Where a version's verdicts lie: its bless and canary tags, and the run that registered it."""
    tags = sorted(key for key in version.tags if key in {"bless", "bless_reasons", "promoted", "forced"}
                  or key.startswith("canary."))
    return f"v{version.version} tags {', '.join(tags) or 'none'}; run {version.run_id or 'none'}"


def roll_back(params: Params) -> Rollback:
    """Move `champion` back to the version that was champion before it, by the alias history (with no history
    yet, the version tagged `previous`); the replaced one is tagged rejected."""
    name = params.data.registered_model_name()
    client = registry_client(params.tracking)
    try:
        with recorded_move(client, name, command_actor("rollback")) as move:
            restored, replaced = rollback(client, name)
            move.reason = f"rollback: v{replaced} replaced, v{restored} was champion before it"
    except LookupError as exc:
        raise TorchshipError(str(exc)) from None
    return Rollback(model_name=name, restored=restored, replaced=replaced, poll_seconds=params.serve.poll_seconds)


def rebaseline_version(params: Params, version: str, reason: str) -> Promotion:
    """Make `version` champion when bless could not compare it with the champion (the input signature or the
    metric changed): an explicit decision, recorded on the version (tag `rebaselined`) and on the registered
    model (tag `baseline`). A version refused for anything else is not re-baselined: fix it or `promote --force`."""
    name, client, found = requested_version(params, version, reason, "rebaseline")
    if found.tags.get("bless") in {"pass", "warn"}:
        raise TorchshipError(f"v{version} was blessed against the champion: nothing to re-baseline; "
                             f"use `torchship promote {version} --reason ...`.")
    outcome = found.tags.get(OUTCOME_TAG)
    if outcome != BlessOutcome.INCOMPARABLE:
        said = f"{outcome}: {found.tags.get('bless_reasons', '')}" if outcome else "no blessing recorded"
        raise TorchshipError(f"v{version} was refused for more than comparability ({said}); "
                             "re-baselining only settles a changed signature or metric.")
    with recorded_move(client, name, command_actor("rebaseline"), f"rebaselined: {reason}", evidence(found)):
        replaced = promote(client, name, str(version), f"rebaselined: {reason}")
        stamp = f"{reason} (replaces v{replaced}, whose inputs or metric are no longer comparable)"
        client.set_model_version_tag(name, str(version), "rebaselined", stamp)
        client.set_registered_model_tag(name, "baseline", f"v{version}: {reason}")
    return Promotion(model_name=name, promoted=str(version), replaced=replaced, forced=False,
                     poll_seconds=params.serve.poll_seconds)
