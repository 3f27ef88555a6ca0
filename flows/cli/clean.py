"""`torchship clean`: the project folder's local state removed (stage outputs, the MLflow store, Prefect's state)."""
from __future__ import annotations

import typer

from flows.cli.output import console
from flows.environment import enter_project


def clean(yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
          cache: bool = typer.Option(False, help="Also empty the DVC cache (.dvc/cache).")) -> None:
    """Remove local state: stage outputs, the MLflow store and Prefect's database (asks first).

    Lists, then removes: each stage's outputs under data/ (DVC's .gitignore files stay), data/quarantine,
    data/serve, data/monitor and data/batches, mlflow/ (registered models and run history) and .prefect/."""
    root = enter_project()
    from tasks.workspace.local_state import local_state, remove_paths

    targets = local_state(root, cache=cache)
    if not targets:
        console.print("Nothing to clean.")
        return
    console.print("Will remove:\n" + "\n".join(f"  {t.relative_to(root)}" for t in targets), highlight=False)
    if not yes and not typer.confirm("Remove these (registered models and run history are lost)?"):
        raise typer.Exit(1)
    remove_paths(targets)
    console.print("Clean.")


