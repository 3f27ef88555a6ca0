"""`torchship dvc-deps` (hidden): each DVC stage's code deps written into dvc.yaml from its import closure."""
from __future__ import annotations

from flows.cli.output import console
from flows.environment import enter_project


def dvc_deps() -> None:
    """Rewrite each DVC stage's code deps in dvc.yaml: every file the stage runs (its import closure, and the
    model file `train.model` names), so a change re-runs exactly the stages whose code changed."""
    root = enter_project()
    from tasks.stages.code_deps import write_code_deps

    changed = write_code_deps(root)
    console.print(f"dvc.yaml: code deps rewritten for {', '.join(changed)}" if changed
                  else "dvc.yaml: code deps are current")
