"""`torchship rebuild`: a registered version rebuilt from its lineage, its metrics compared."""
from __future__ import annotations

import typer
from rich.table import Table

from flows.cli.output import console
from flows.environment import enter_project


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
    from tasks.stages.rebuild import rebuild_version

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
