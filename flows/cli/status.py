"""`torchship status` and `torchship history`: the registry state of this project's model, its alias history and
the latest drift -> retrain decisions."""
from __future__ import annotations

import time

import typer
from rich.table import Table

from flows.cli.output import console
from flows.environment import enter_project


def status() -> None:
    """Registry state of this project's model (versions, aliases, bless/canary verdicts, git commits) and the
    latest drift -> retrain decisions (fired or suppressed, and why)."""
    enter_project()
    from flows.cli.monitor import decisions_table
    from tasks.config import load_params
    from tasks.core import paths
    from tasks.monitoring.guards import decision_log, last_decisions
    from tasks.registry.status import registry_status

    params = load_params()
    state = registry_status(params)
    where = decision_log(params.serve, paths.DECISIONS)
    if decisions := last_decisions(where):
        console.print(decisions_table(decisions, where))
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
    if state.history:
        console.print(history_table(state.history, f"{state.model_name}: last alias moves (torchship history)",
                                    evidence=False))
    for action in state.approvals:
        console.print(f"approval: {action.action}" + (" ([bold]torchship canary[/] starts its canary now; the next "
                                                       "pipeline or monitor run does otherwise)"
                                                       if action.canary_due else ""))
    for waiting in state.waiting:
        console.print(f"[yellow]v{waiting.version} awaits approval[/] until {utc(waiting.deadline)} UTC: "
                      f"torchship approve|reject {waiting.version} --reason ...")
    if state.champion_concern:
        console.print(f"[yellow]champion v{state.aliases.get('champion')} serves although {state.champion_concern}"
                      "[/]: a person moved it there (metric torchship_champion_unblessed, ticket alert).")


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))


def history_table(entries, title: str, evidence: bool = True) -> Table:
    """Alias history entries as a table, oldest first (status leaves the evidence to `torchship history`)."""
    table = Table(title=title)
    for column in ("#", "time (UTC)", "alias", "move", "actor", "reason", "evidence")[:7 if evidence else 6]:
        table.add_column(column, overflow="fold")
    for entry in entries:
        row = [str(entry.seq), entry.time, entry.alias or "—", entry.moved() if entry.alias else entry.kind,
               entry.actor, entry.reason, entry.evidence]
        table.add_row(*row[:7 if evidence else 6])
    return table


def history(model: str = typer.Argument(None, help="The registered model (default: this project's).")) -> None:
    """The alias history: every move of `champion` and `challenger`, who made it (a torchship command and its OS
    user, a pipeline or canary run, or "outside torchship" for the MLflow UI, with when it was noticed), why, and
    where the evidence lies. Moves nobody recorded yet are recorded first."""
    enter_project()
    from tasks.config import load_params
    from tasks.registry.status import alias_history

    name, entries = alias_history(load_params(), model)
    if not entries:
        console.print(f"No alias history for '{name}' yet: its first alias move starts it.")
        return
    console.print(history_table(entries, f"{name}: alias history ({len(entries)} entries)"))


