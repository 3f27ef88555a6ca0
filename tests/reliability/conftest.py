"""A run that fails during the canary after it registered: a copy of the session's project with an empty
registry, re-run with secrets planted and a canary service given no time to start. Every DVC stage is cached
(nothing in them changed), so bless and register run, v1 is registered and becomes champion, and then the canary
fails: the failure point whose closing line used to say nothing was registered."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import pytest

from tests.conftest import SECRET_ENV, Project


@dataclass
class CanaryFailure:
    project: Project
    session_project: Project
    session_run: subprocess.CompletedProcess   # the session's pipeline run, secrets planted (tests/conftest.py)
    failed: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def canary_failure(tmp_path_factory, tiny_pipeline) -> CanaryFailure:
    session_project, session_run = tiny_pipeline
    root = tmp_path_factory.mktemp("canary-failure") / "project"
    shutil.copytree(session_project.root, root, symlinks=True)
    for state in (root / "mlflow").iterdir():   # the registry and its artifacts (only .gitkeep is tracked)
        if state.name != ".gitkeep":
            shutil.rmtree(state) if state.is_dir() else state.unlink()
    project = Project(root, session_project.prefect)
    failed = project.torchship("run", "--set", "canary.startup_timeout_s=0.01", env=SECRET_ENV)
    return CanaryFailure(project, session_project, session_run, failed)
