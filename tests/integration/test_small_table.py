"""A small table through the real CLI: scikit-learn's iris (150 rows, four numeric columns, three classes) is below
train.cv_max_rows, so `train.model: auto` cross-validates the softmax-linear model and the MLP on periodic numeric
embeddings on the same folds, serves the better family's members as one averaging graph, and records the choice; the
graph is registered as champion and `torchship predict` scores rows with it. Kept cheap (it runs every stage): the
smallest bundled table, two folds (members) where the default is five, the baseline's cross-validation on two folds
and shorter boosting, no student; none of these is what the test asserts."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import make_project

pytestmark = pytest.mark.integration
MODEL = "sklearn-iris"
FOLDS = 2   # the fewest train.cv_folds allows: still k members averaged in one graph, at 2/5 of the default's cost
SMALL = {"data": {"source": "sklearn:iris", "target": None},
         # auto: the family is chosen on evidence; the tiny params' FT-Transformer settings stay unused
         "train": {"model": "auto", "epochs": 3, "batch_size": 32, "cv_folds": FOLDS},
         "baseline": {"cv_folds": 2, "boosting_max_iter": 20},   # the gate is off in the tiny params (max gap 1.0)
         "distill": {"enabled": False}}   # the student: proven by the session's first run


def test_a_small_table_is_cross_validated_served_as_one_graph_and_scored(tmp_path, prefect_server):
    project = make_project(tmp_path / "project", SMALL, prefect=prefect_server)
    run = project.torchship("run")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    metrics = json.loads((project.root / "data/train/metrics.json").read_text())
    chosen = metrics["cross_validation"]
    assert chosen["folds"] == FOLDS and set(chosen["candidates"]) == {"linear", "mlp_plr"}
    assert chosen["chosen"] in chosen["candidates"]
    assert chosen["candidates"][chosen["chosen"]] == chosen["out_of_fold"]   # the chosen family's own figures
    assert f"picked {chosen['chosen']}" in " ".join(run.stdout.split())      # the summary says which and why
    assert "champion" in project.registry(MODEL)["aliases"], run.stdout[-3000:]
    # The registered graph answers for the table's raw rows, as the service would.
    holdout = pd.read_parquet(project.root / "data/prepare/holdout.parquet")
    holdout.drop(columns=["target"]).to_csv(project.root / "rows.csv", index=False)
    scored = project.torchship("predict", "rows.csv", "--output", "scored.csv")
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
    predictions = pd.read_csv(project.root / "scored.csv")
    assert len(predictions) == len(holdout)
    assert (predictions.filter(like="prob").sum(axis=1) - 1).abs().max() < 1e-4
