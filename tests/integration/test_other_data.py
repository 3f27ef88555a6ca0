"""The same pipeline, unchanged, on a table the user brings and on a scikit-learn data set."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_project

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server):
    # The student is covered by the session pipeline; here the data is the point, so the teacher is served.
    return make_project(tmp_path_factory.mktemp("other-data"), {"distill": {"enabled": False}},
                        prefect=prefect_server)


def test_user_csv_multiclass_string_labels_odd_column_names(project):
    from tasks.core.sources import generate_customers

    table = generate_customers(2500, seed=11).rename(columns={"customer age": "Age (years)",
                                                              "monthly charges ($)": "monthly/charges $"})
    spend = table["monthly/charges $"].rank(pct=True) + np.random.default_rng(0).normal(0, 0.1, len(table))
    table = table.drop(columns=["churned"])
    table["Segment: 2026"] = np.select([spend < 0.33, spend < 0.66], ["bronze", "silver"], "gold")
    table.to_csv(project.root / "data" / "my customers.csv", index=False)

    result = project.torchship("run", "--set", "data.source=data/my customers.csv",
                               "--set", "data.target=Segment: 2026")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    registry = project.registry("my-customers")
    assert "champion" in registry["aliases"]
    schema = (project.root / "data" / "prepare" / "schema.json").read_text()
    assert '"bronze"' in schema and "Age (years)" in schema
    assert "3 classes" in result.stdout


def test_sklearn_digits_ten_classes(project):
    result = project.torchship("run", "--set", "data.source=sklearn:digits", "--set", "data.target=null")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "10 classes" in result.stdout
    registry = project.registry("sklearn-digits")
    assert "champion" in registry["aliases"]
    # The earlier data set keeps its own model and champion.
    assert "champion" in project.registry("my-customers")["aliases"]
