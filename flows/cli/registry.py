"""`torchship status`, `history`, `promote`, `rollback`, `rebaseline`, `rebuild`, `approve`, `reject`: the registry
state of this project's model, its alias history, the by-hand moves and the approval decisions."""
from __future__ import annotations

import os
import time

import typer
from rich.table import Table

from flows.cli.output import console
from flows.environment import enter_project
from tasks.core.env import TOKEN_ENV


def status() -> None:
    """Registry state of this project's model (versions, aliases, bless/canary verdicts, git commits) and the
    latest drift -> retrain decisions (fired or suppressed, and why)."""
    enter_project()
    from flows.cli.loop import decisions_table
    from tasks.config import load_params
    from tasks.core import paths
    from tasks.monitoring.guards import decision_log, last_decisions
    from tasks.ops.status import registry_status

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


def approve(version: str = typer.Argument(..., help="The version awaiting approval."),
            reason: str = typer.Option(..., "--reason", help="Why: recorded in the alias history."),
            url: str = typer.Option(None, "--url", help="Run its canary on this running service's live traffic "
                                                        "(as `torchship canary --url`). Default: replayed rows."),
            token: str = typer.Option(None, "--token", envvar=TOKEN_ENV, show_envvar=True,
                                      help="The admin token the service at --url was started with."),
            request_log: str = typer.Option(None, "--request-log", help="The request log of the service at --url "
                                                                        "(default: serve.request_log).")) -> None:
    """Approve VERSION (registered awaiting approval, promotion.approval: required): it takes `challenger` and its
    canary starts now (as `torchship canary`, on the service at --url when given). The decision and the OS user
    go in the alias history. A version past promotion.approval_timeout_s is rejected instead."""
    enter_project()
    from flows.cli.canary import render
    from tasks.config import load_params
    from tasks.core.alias_history import command_actor, os_user
    from tasks.ops.approvals import decide_by_hand

    done = decide_by_hand(load_params(), version, "approved", reason, command_actor("approve"), os_user())
    console.print(done.action)
    if done.canary_due:
        from flows.canary import canary_flow

        if token:
            os.environ[TOKEN_ENV] = token
        with console.status("canary: shadow, then canary.steps; each step waits for canary.min_samples"):
            render(canary_flow(params_file="params.yaml", url=url, request_log=request_log))


def reject(version: str = typer.Argument(..., help="The version awaiting approval."),
           reason: str = typer.Option(..., "--reason", help="Why: recorded on the version and in the history.")
           ) -> None:
    """Reject VERSION (registered awaiting approval): tagged rejected, never canaried; `champion` is untouched.
    The decision and the OS user go in the alias history."""
    enter_project()
    from tasks.config import load_params
    from tasks.core.alias_history import command_actor, os_user
    from tasks.ops.approvals import decide_by_hand

    console.print(decide_by_hand(load_params(), version, "rejected", reason, command_actor("reject"), os_user()).action)


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
    from tasks.ops.status import alias_history

    name, entries = alias_history(load_params(), model)
    if not entries:
        console.print(f"No alias history for '{name}' yet: its first alias move starts it.")
        return
    console.print(history_table(entries, f"{name}: alias history ({len(entries)} entries)"))


def rollback() -> None:
    """Put back the version that was champion before the current one, by the alias history (with no history
    yet, the version tagged `previous`); the current one is tagged rejected.

    Running services follow the alias within serve.poll_seconds."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.alias_moves import roll_back

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
    from tasks.ops.alias_moves import promote_version

    done = promote_version(load_params(), version, reason, force)
    was = f" (was v{done.replaced}, tagged previous)" if done.replaced and done.replaced != done.promoted else ""
    forced = " [yellow]forced[/]" if done.forced else ""
    console.print(f"champion of {done.model_name} is v{done.promoted}{was}{forced}; "
                  f"running services follow within {done.poll_seconds:g}s.")


def rebaseline(version: str = typer.Argument(..., help="The registered version to make the new baseline champion."),
               reason: str = typer.Option(..., "--reason", help="Why the old champion no longer compares: recorded "
                                                                "on the version and the registered model.")) -> None:
    """Make VERSION champion when bless could not compare it with the champion: its input columns or the
    bless metric changed, so "better than the champion" has no meaning. An explicit, audited decision (tags
    `rebaselined` on the version and `baseline` on the model; the old champion is tagged `previous`).
    A version refused for anything else (e.g. worse than the scikit-learn baselines) is refused here too."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.alias_moves import rebaseline_version

    done = rebaseline_version(load_params(), version, reason)
    was = f" (v{done.replaced} tagged previous)" if done.replaced else ""
    console.print(f"champion of {done.model_name} is v{done.promoted}, re-baselined{was}; "
                  f"running services follow within {done.poll_seconds:g}s.")


def rebuild(version: str = typer.Argument(..., help="The registered version to rebuild."),
            tolerance: float = typer.Option(0.01, "--tolerance", help="Largest allowed difference of each holdout "
                                                                      "metric (accuracy, macro-F1)."),
            keep: bool = typer.Option(False, "--keep", help="Keep the temporary workspace to inspect it.")) -> None:
    """Rebuild VERSION from what it recorded and compare its metrics: the git commit is checked out into a
    temporary workspace, the version's own `params.yaml` and `dvc.lock` (logged by register, so `--set`
    overrides and retrains are covered) are restored, the prepared data is pulled from the DVC remote, and
    every later stage re-runs forced (never from DVC's run cache). Exit 1 when a metric differs by more than
    --tolerance. Nothing in this project or its registry changes."""
    enter_project()
    from tasks.config import load_params
    from tasks.ops.rebuild import rebuild_version

    done = rebuild_version(load_params(), version, tolerance, keep)
    table = Table(title=f"{done.model_name} v{done.version} rebuilt from {done.commit[:10]} in {done.seconds:.0f}s")
    for column in ("holdout metric", "registered", "rebuilt", "difference"):
        table.add_column(column)
    for metric, value in done.registered.items():
        rebuilt = done.rebuilt.get(metric)
        table.add_row(metric, f"{value:.4f}", "—" if rebuilt is None else f"{rebuilt:.4f}",
                      "—" if rebuilt is None else f"{rebuilt - value:+.4f}")
    console.print(table)
    if keep:
        console.print(f"workspace kept: {done.workspace}")
    if not done.matched:
        console.print(f"[red]v{done.version} did not rebuild within {done.tolerance}[/]")
        raise typer.Exit(1)
    console.print(f"[green]v{done.version} rebuilt: every metric within {done.tolerance}[/]")
