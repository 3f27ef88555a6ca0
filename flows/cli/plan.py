"""`torchship plan`: which stages a run with these overrides would re-run, and why; changes nothing."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from flows.cli.output import console
from flows.cli.run import COLOURS, PARAMS_HELP, SET_HELP
from flows.environment import enter_project


def plan(params: Path = typer.Option(None, "--params", help=PARAMS_HELP),
         set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Show which DVC stages would re-run, and why, with these overrides (nothing runs, nothing changes)."""
    params_file = str(params.resolve()) if params else None
    enter_project()
    from tasks.stages.plan import plan_run

    steps = plan_run(set_, params_file)
    table = Table(title="torchship plan (from dvc status)")
    table.add_column("stage")
    table.add_column("would")
    table.add_column("why", overflow="fold")
    for step in steps:
        table.add_row(step.step, f"[{COLOURS[step.would]}]{step.would}[/]", step.why)
    console.print(table)
