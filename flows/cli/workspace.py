"""`torchship clean`, `torchship config-docs` and `torchship dvc-deps`: the project folder's local state and generated
files."""
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
    from tasks.ops.workspace import local_state, remove_paths

    targets = local_state(root, cache=cache)
    if not targets:
        console.print("Nothing to clean.")
        return
    console.print("Will remove:\n" + "\n".join(f"  {t.relative_to(root)}" for t in targets), highlight=False)
    if not yes and not typer.confirm("Remove these (registered models and run history are lost)?"):
        raise typer.Exit(1)
    remove_paths(targets)
    console.print("Clean.")


def config_docs() -> None:
    """Regenerate docs/configuration.md from the typed configuration."""
    root = enter_project()
    from tasks.ops.workspace import write_configuration_docs

    console.print(f"wrote {write_configuration_docs(root).relative_to(root)}")


def dvc_deps() -> None:
    """Rewrite each DVC stage's code deps in dvc.yaml: every file the stage runs (its import closure, and the
    model file `train.model` names), so a change re-runs exactly the stages whose code changed."""
    root = enter_project()
    from tasks.ops.stage_deps import write_code_deps

    changed = write_code_deps(root)
    console.print(f"dvc.yaml: code deps rewritten for {', '.join(changed)}" if changed
                  else "dvc.yaml: code deps are current")
