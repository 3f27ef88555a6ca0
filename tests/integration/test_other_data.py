"""The same pipeline, unchanged, on a table the user brings: odd column names, string labels, three classes,
registered under its own name while the project's first model keeps its champion."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import light_run_flags, workspace_restored

pytestmark = pytest.mark.integration


def test_user_csv_multiclass_string_labels_odd_column_names(tiny_pipeline):
    from tasks.core.sources import generate_customers

    project, _ = tiny_pipeline
    table = generate_customers(2500, seed=11).rename(columns={"customer age": "Age (years)",
                                                              "monthly charges ($)": "monthly/charges $"})
    spend = table["monthly/charges $"].rank(pct=True) + np.random.default_rng(0).normal(0, 0.1, len(table))
    table = table.drop(columns=["churned"])
    table["Segment: 2026"] = np.select([spend < 0.33, spend < 0.66], ["bronze", "silver"], "gold")
    source = project.root / "data" / "my customers.csv"
    table.to_csv(source, index=False)
    champion = project.registry("synthetic-churn")["aliases"]["champion"]
    try:
        with workspace_restored(project, "synthetic-churn"):
            # The data is the point here (light_run_flags: the first run proved compile, dynamo and the student).
            result = project.torchship("run", "--set", "data.source=data/my customers.csv",
                                       "--set", "data.target=Segment: 2026", *light_run_flags())
            schema = (project.root / "data" / "prepare" / "schema.json").read_text()
    finally:
        source.unlink()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "3 classes" in result.stdout
    assert '"bronze"' in schema and "Age (years)" in schema
    assert "champion" in project.registry("my-customers")["aliases"]
    # The first data set keeps its own model and champion.
    assert project.registry("synthetic-churn")["aliases"]["champion"] == champion
