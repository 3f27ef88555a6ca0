"""Process environment for every entry point: project-local state, no telemetry. Set before Prefect is imported."""
from __future__ import annotations

import os
from pathlib import Path

from tasks.core.env import QUIET, prefect_state, set_defaults


def find_project_root(start: Path | None = None) -> Path:
    """The folder holding params.yaml and dvc.yaml, from here upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "params.yaml").exists() and (folder / "dvc.yaml").exists():
            return folder
    return here


def configure_environment(root: Path) -> None:
    """Keep Prefect's database and results inside the project (not ~/.prefect); switch telemetry off."""
    set_defaults(QUIET)
    state = root / ".prefect"
    (state / "db").mkdir(parents=True, exist_ok=True)
    set_defaults(prefect_state(state))


def enter_project(start: Path | None = None) -> Path:
    """Every command runs in the project folder (paths in params.yaml and dvc.yaml are relative to it)."""
    root = find_project_root(start)
    os.chdir(root)
    configure_environment(root)
    return root


def server_configured() -> bool:
    """A Prefect server to send events to (else: the embedded default, where nothing would hear them)."""
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())
