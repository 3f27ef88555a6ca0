"""`torchship status` and `torchship rollback`: the registry state of this project's model."""
from __future__ import annotations

import typer
from rich.table import Table

from flows.cli.output import console
from flows.environment import enter_project


def status() -> None:
    """Registry state of this project's model (versions, aliases, bless/canary verdicts, git commits) and the
    latest drift -> retrain decisions (fired or suppressed, and why)."""
    enter_project()
    from flows.cli.loop import decisions_table
    from tasks.config import load_params
    from tasks.core import paths
    from tasks.monitoring.guards import last_decisions
    from tasks.ops.status import registry_status

    state = registry_status(load_params())
    decisions = last_decisions(paths.DECISIONS)
    if decisions:
        console.print(decisions_table(decisions))
    if not state.versions:
        console.print(f"No registered versions of '{state.model_name}' yet: run [bold]torchship run[/].")
        return
    held = ", ".join(f"{alias} → v{version}" for alias, version in state.aliases.items()) or "none"
    table = Table(title=f"{state.model_name}: aliases {held}")
    for column in ("version", "aliases", "bless", "notes", "git"):
        table.add_column(column, overflow="fold")
    for row in state.versions:
        table.add_row(f"v{row.version}", ", ".join(row.aliases), row.bless, row.notes, row.git_commit)
    console.print(table)


def rollback() -> None:
    """Put the version tagged `previous` back as champion (the current one is tagged rejected).

    Running services follow the alias within serve.poll_seconds."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.status import roll_back

    done = roll_back(load_params())
    console.print(f"champion of {done.model_name} is v{done.restored} again (v{done.replaced} tagged rejected); "
                  f"running services follow within {done.poll_seconds:g}s.")


def promote(version: str = typer.Argument(..., help="The registered version to make champion."),
            reason: str = typer.Option(..., "--reason", help="Why: recorded on the version (tag `promoted`)."),
            force: bool = typer.Option(False, "--force", help="Promote a version bless did not pass (recorded as "
                                                              "tag `forced`).")) -> None:
    """Move `champion` to VERSION by hand; the old champion is tagged `previous` (so `torchship rollback`
    undoes it). A version that bless did not pass is refused unless --force. Running services follow the
    alias within serve.poll_seconds."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.status import promote_version

    done = promote_version(load_params(), version, reason, force)
    was = f" (was v{done.replaced}, tagged previous)" if done.replaced and done.replaced != done.promoted else ""
    console.print(f"champion of {done.model_name} is v{done.promoted}{was}{' [yellow]forced[/]' if done.forced else ''}; "
                  f"running services follow within {done.poll_seconds:g}s.")
