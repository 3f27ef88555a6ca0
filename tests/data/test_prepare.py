"""tasks/prepare.py: the strict, stratified three-way split and the schema fitted on train only."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.core.params_spec import DataParams, PrepareParams
from tasks.core.errors import DataError
from tasks.modalities.table.sources import fingerprint_source
from tasks.modalities.table.prepare import prepare_tables

TARGET = "churned"


@pytest.fixture(scope="module")
def prepared(customers):
    return prepare_tables(customers, TARGET, "synthetic", PrepareParams(val_fraction=0.2, holdout_fraction=0.1, seed=1))


def test_split_sizes_follow_the_fractions(prepared, customers):
    n = len(customers)
    assert len(prepared.train) + len(prepared.val) + len(prepared.holdout) == n
    assert abs(len(prepared.holdout) - 0.1 * n) <= 1
    assert abs(len(prepared.val) - 0.2 * n) <= 1


def test_splits_do_not_share_rows(prepared):
    key = lambda frame: set(map(tuple, frame.astype(str).to_numpy()))  # noqa: E731
    train, val, holdout = key(prepared.train), key(prepared.val), key(prepared.holdout)
    assert not (train & val) and not (train & holdout) and not (val & holdout)


def test_stratification_keeps_class_shares(prepared, customers):
    overall = (customers[TARGET] == "yes").mean()
    for split in (prepared.train, prepared.val, prepared.holdout):
        assert abs((split[TARGET] == "yes").mean() - overall) < 0.02


def test_schema_lists_features_and_sorted_classes(prepared, customers):
    schema = prepared.schema
    assert schema.target == TARGET and schema.classes == ["no", "yes"]
    assert schema.feature_names == [c for c in customers.columns if c != TARGET]
    kinds = {f.name: f.kind for f in schema.features}
    assert kinds["plan"] == "categorical" and kinds["customer age"] == "numeric"


def test_same_seed_same_split(customers, prepared):
    again = prepare_tables(customers, TARGET, "synthetic",
                           PrepareParams(val_fraction=0.2, holdout_fraction=0.1, seed=1))
    pd.testing.assert_frame_equal(again.holdout, prepared.holdout)
    other = prepare_tables(customers, TARGET, "synthetic",
                           PrepareParams(val_fraction=0.2, holdout_fraction=0.1, seed=2))
    assert not other.holdout.equals(prepared.holdout)


def test_categories_are_fitted_on_the_train_split_only():
    rng = np.random.default_rng(0)
    n = 400
    raw = pd.DataFrame({"x": rng.normal(size=n), "colour": rng.choice(["red", "blue"], n),
                        "y": rng.choice(["a", "b"], n)})
    raw.loc[:9, "colour"] = "violet"  # ten rows with a rare category
    prepared = prepare_tables(raw, "y", "t", PrepareParams(seed=3))
    colours = next(f for f in prepared.schema.features if f.name == "colour").categories
    seen_in_train = set(prepared.train["colour"])
    assert set(colours) == seen_in_train
    assert ("violet" in colours) == ("violet" in seen_in_train)
    # The seed must put at least one 'violet' row outside train for this to mean anything:
    outside = set(prepared.val["colour"]) | set(prepared.holdout["colour"])
    assert "violet" in outside


def test_category_only_in_holdout_is_not_in_the_schema():
    rng = np.random.default_rng(1)
    n = 300
    raw = pd.DataFrame({"x": rng.normal(size=n), "colour": rng.choice(["red", "blue"], n),
                        "y": rng.choice(["a", "b"], n)})
    probe = prepare_tables(raw, "y", "t", PrepareParams(seed=5))
    # Rebuild with one holdout row's colour changed to a category nowhere else: the split is the same
    # (it depends on the target only), so that category lands in holdout alone.
    marker = probe.holdout["x"].iloc[0]
    raw.loc[raw["x"] == marker, "colour"] = "violet"
    prepared = prepare_tables(raw, "y", "t", PrepareParams(seed=5))
    assert "violet" in set(prepared.holdout["colour"])
    colours = next(f for f in prepared.schema.features if f.name == "colour").categories
    assert colours == ["blue", "red"]


def test_max_categories_keeps_the_most_frequent():
    raw = pd.DataFrame({"c": ["a"] * 50 + ["b"] * 30 + ["c"] * 5 + ["d"] * 2 + ["a"] * 13,
                        "y": ["p", "q"] * 50})
    prepared = prepare_tables(raw, "y", "t", PrepareParams(max_categories=2))
    assert next(f for f in prepared.schema.features if f.name == "c").categories == ["a", "b"]


def test_a_class_with_fewer_than_three_rows_is_refused():
    raw = pd.DataFrame({"x": np.arange(40.0), "y": ["a"] * 20 + ["b"] * 18 + ["c"] * 2})
    with pytest.raises(DataError, match="only 2 row"):
        prepare_tables(raw, "y", "t", PrepareParams())


def test_numeric_labels_become_text_labels():
    raw = pd.DataFrame({"x": np.arange(60.0), "y": [10, 2] * 30})
    prepared = prepare_tables(raw, "y", "t", PrepareParams())
    assert prepared.schema.classes == ["2", "10"]
    assert set(prepared.train["y"]) == {"2", "10"}


def test_too_few_rows_for_the_classes_is_a_data_error():
    raw = pd.DataFrame({"x": np.arange(30.0), "y": [str(i % 10) for i in range(30)]})  # 10 classes x 3 rows
    with pytest.raises(DataError):
        prepare_tables(raw, "y", "t", PrepareParams())


def test_fingerprint_follows_file_content(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,label\n1,x\n")
    data = DataParams(source=str(path), target="label")
    first = fingerprint_source(data)
    assert first == fingerprint_source(data) and "md5" in first
    path.write_text("a,label\n2,x\n")
    assert fingerprint_source(data)["md5"] != first["md5"]


def test_fingerprint_of_a_built_in_source_is_its_spec():
    assert fingerprint_source(DataParams(source="sklearn:iris")) == {"source": "sklearn:iris"}
