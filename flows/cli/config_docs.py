"""`torchship config-docs` (hidden): the generated docs written again from the code."""
from __future__ import annotations

from flows.cli.output import console
from flows.environment import enter_project


def config_docs() -> None:
    """Regenerate docs/configuration.md from the typed configuration, and the pipeline's diagram and step table in
    the README and the docs from dvc.yaml."""
    root = enter_project()
    from tasks.workspace.config_docs import write_generated_docs

    for written in write_generated_docs(root):
        console.print(f"wrote {written.relative_to(root)}")
