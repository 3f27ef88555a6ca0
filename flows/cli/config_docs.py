"""`torchship config-docs` (hidden): the generated docs written again from the code."""
from __future__ import annotations

from flows.cli.output import console
from flows.environment import enter_project


def config_docs() -> None:
    """Regenerate docs/configuration.md from the typed configuration."""
    root = enter_project()
    from tasks.workspace.local_state import write_configuration_docs

    console.print(f"wrote {write_configuration_docs(root).relative_to(root)}")
