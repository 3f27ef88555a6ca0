"""Plain `dvc repro` (no torchship) sees an edited source file: the source stage fingerprints it into
data/source.json, which prepare depends on, so an edit re-runs prepare and no edit re-runs nothing."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import make_project

pytestmark = pytest.mark.integration


def _dvc(project, *args: str) -> subprocess.CompletedProcess:
    """`dvc` as a user runs it in the project's activated environment (dvc.yaml's `python` is the venv's)."""
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project.root, capture_output=True, text=True,
                          timeout=300, env=project.env())


def test_plain_dvc_repro_reruns_prepare_after_the_source_file_is_edited(tmp_path):
    from tasks.modalities.table.sources import generate_customers

    project = make_project(tmp_path, {"data": {"source": "data/rows.csv", "target": "churned"}})
    source = project.root / "data" / "rows.csv"
    generate_customers(300, seed=4).to_csv(source, index=False)
    first = _dvc(project, "repro", "prepare")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "Running stage 'prepare'" in first.stdout
    rows_before = (project.root / "data" / "prepare" / "metrics.json").read_text()

    generate_customers(360, seed=4).to_csv(source, index=False)        # the user edits the file: 60 more rows
    edited = _dvc(project, "repro", "prepare")
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "Running stage 'prepare'" in edited.stdout
    assert (project.root / "data" / "prepare" / "metrics.json").read_text() != rows_before

    again = _dvc(project, "repro", "prepare")                             # nothing edited: nothing re-runs
    assert again.returncode == 0 and "Running stage 'prepare'" not in again.stdout
    assert "'prepare' didn't change, skipping" in again.stdout
