"""`torchship monitor`: Evidently drift of the served window, which may start a retrain; the decisions as a table."""
from __future__ import annotations

import typer
from rich.table import Table

from flows.cli.output import console, quiet_expected_tracebacks
from flows.environment import enter_project


def monitor(report_only: bool = typer.Option(False, "--report-only",
                                             help="Judge and record, but never start a retrain.")) -> None:
    """Judge the newest window of served traffic for drift (Evidently) against the training split.

    On material drift, and unless a guard holds it back (cooldown, daily budget, too few new labels, loop
    protection, a busy workspace), start a retrain: with a Prefect server by the event torchship.drift.detected
    (the `retrain` deployment's trigger), in the embedded default by calling the retrain flow. Exits 0 either
    way; the decision and its reasons are printed, recorded, and shown by `torchship status`."""
    enter_project()
    from flows.monitor import monitor as monitor_flow

    quiet_expected_tracebacks()
    decision = monitor_flow(params_file="params.yaml", act=not report_only)
    render_decision(decision)


def render_decision(decision) -> None:
    colour = {"fired": "yellow", "suppressed": "cyan", "no drift": "green", "retrained": "green"}[decision.outcome]
    console.print(f"[bold]{decision.gate.gate} gate[/] {decision.gate.summary()}")
    console.print(f"[bold]trigger[/] [{colour}]{decision.outcome}[/]: " + "; ".join(decision.reasons))
    if decision.run:
        console.print(f"  retrain: {decision.run}")
    if decision.report:
        console.print(f"  Evidently report: {decision.report}")


def decisions_table(decisions, where: object = "data/monitor/decisions.jsonl") -> Table:
    import datetime as dt

    table = Table(title=f"drift → retrain decisions (newest first; {where})")
    for column in ("time (UTC)", "outcome", "why", "window"):
        table.add_column(column, overflow="fold")
    for d in decisions:
        when = dt.datetime.fromtimestamp(d.ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        window = f"{d.window.get('rows', '?')} rows, {d.window.get('labelled', '?')} labelled" if d.window else ""
        table.add_row(when, d.outcome, "; ".join(d.reasons), window)
    return table


