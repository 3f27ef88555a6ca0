"""The validate stage's gate (tasks/modalities/table/expectations.py): the real Great Expectations suite on prepared splits
(fails name the column)."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.core.params_spec import PrepareParams, ValidateParams
from tasks.core.errors import GateFailed
from tasks.modalities.table.expectations import validate_frames
from tasks.modalities.table.prepare import prepare_tables

RULES = ValidateParams(min_rows=50, max_null_share=0.5)


@pytest.fixture(scope="module")
def prepared(customers):
    return prepare_tables(customers.iloc[:600], "churned", "synthetic", PrepareParams(seed=0))


def test_prepared_splits_pass_and_leave_data_docs(prepared, tmp_path):
    docs = tmp_path / "docs"
    frames = {"train": prepared.train, "val": prepared.val, "holdout": prepared.holdout}
    result, rows = validate_frames(frames, prepared.schema, RULES, docs_dir=docs)
    assert result.status == "pass", result.reasons
    assert {r["split"] for r in rows} == set(frames) and all(r["success"] for r in rows)
    assert (docs / "index.html").is_file()
    assert result.evidence == str(docs / "index.html")


def test_missing_column_fails_naming_it(prepared):
    result, rows = validate_frames({"val": prepared.val.drop(columns=["plan"])}, prepared.schema, RULES)
    assert result.status == "fail"
    assert any("'plan'" in reason for reason in result.reasons)
    assert any(r["expectation"] == "expect_table_columns_to_match_set" and not r["success"] for r in rows)
    with pytest.raises(GateFailed):
        result.enforce()


def test_target_value_outside_the_classes_fails_naming_the_column(prepared):
    bad = prepared.val.copy()
    bad.loc[bad.index[:2], "churned"] = "maybe"
    result, _ = validate_frames({"val": bad}, prepared.schema, RULES)
    assert result.status == "fail"
    assert any("'churned'" in reason and "maybe" in reason for reason in result.reasons)


def test_unseen_category_only_warns(prepared):
    holdout = prepared.holdout.copy()
    holdout.loc[holdout.index[:5], "region"] = "atlantis"  # ~5% of rows: over the 1% the suite tolerates
    result, _ = validate_frames({"holdout": holdout}, prepared.schema, RULES)
    assert result.status == "warn"
    assert any("'region'" in reason and "atlantis" in reason for reason in result.reasons)
    result.enforce(warn_blocks=False)
    with pytest.raises(GateFailed):
        result.enforce(warn_blocks=True)


def test_too_many_nulls_and_too_few_rows_fail(prepared):
    train = prepared.train.copy()
    train.loc[train.index[: int(0.8 * len(train))], "tenure_months"] = np.nan
    result, _ = validate_frames({"train": train}, prepared.schema, ValidateParams(min_rows=len(train) + 1))
    assert result.status == "fail"
    assert any("not_be_null on 'tenure_months'" in reason for reason in result.reasons)
    assert any("row_count" in reason for reason in result.reasons)
