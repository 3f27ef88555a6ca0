"""Bad input stops with one clear paragraph, exits non-zero, and loses nothing."""
from __future__ import annotations

import pytest

from tasks.contract import read_raw_table
from tasks.core.errors import DataError
from tests.helpers import snapshot

pytestmark = pytest.mark.integration

MODEL = "synthetic-churn"


def _assert_untouched(project, before):
    assert snapshot(project, MODEL) == before


def test_params_typo_names_the_key(tiny_pipeline):
    project, _ = tiny_pipeline
    before = snapshot(project, MODEL)
    result = project.torchship("run", "--set", "train.epoch=3")
    assert result.returncode != 0
    assert "train.epoch" in result.stderr and "epochs" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    _assert_untouched(project, before)


def test_missing_data_file(tiny_pipeline):
    project, _ = tiny_pipeline
    before = snapshot(project, MODEL)
    result = project.torchship("run", "--set", "data.source=data/nope.csv", "--set", "data.target=y")
    assert result.returncode != 0
    assert "data/nope.csv not found" in result.stderr
    assert "Traceback" not in result.stderr
    _assert_untouched(project, before)


def test_target_column_that_does_not_exist(tiny_pipeline):
    project, _ = tiny_pipeline
    before = snapshot(project, MODEL)
    result = project.torchship("run", "--set", "data.target=no_such_column")
    assert result.returncode != 0
    assert "'no_such_column' does not exist" in result.stderr
    _assert_untouched(project, before)


def test_corrupt_csv_row_is_refused_by_column_and_line(tiny_pipeline):
    project, _ = tiny_pipeline
    before = snapshot(project, MODEL)
    from tasks.core.sources import generate_customers

    table = generate_customers(400, seed=5)
    path = project.root / "data" / "messy.csv"
    table.to_csv(path, index=False)
    lines = path.read_text().splitlines()
    cells = lines[9].split(",")
    cells[1] = "twelve"                      # tenure_months on file line 10
    lines[9] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    result = project.torchship("run", "--set", "data.source=data/messy.csv", "--set", "data.target=churned")
    assert result.returncode != 0
    assert "tenure_months" in result.stderr and "line 10" in result.stderr
    assert (project.root / "data" / "quarantine").exists()
    _assert_untouched(project, before)

    # Now also ragged: the same door (the prepare stage's parse) names that line first; in-process, since the
    # run above already proved what a refusal leaves untouched.
    lines[9] = ",".join(lines[9].split(",")[:5])
    lines[9 - 1] = lines[8] + ",extra"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="line 9: ragged row"):
        read_raw_table(path)
    path.unlink()
