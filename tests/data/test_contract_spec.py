"""The declared contract: a suggestion passes its own reference data; later data is typed by the contract."""
from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from tasks.modalities.table.parse import parse_table, parse_with_contract
from tasks.modalities.table.contract import ColumnRule, suggest_contract
from tasks.core.errors import DataError
from tasks.modalities.table.expectations import validate_frames
from tasks.config import default_params
from tasks.core.params_spec import PrepareParams, ValidateParams
from tasks.modalities.table.prepare import prepare_tables


@pytest.fixture(scope="module")
def suggested(customers):
    typed, kinds = parse_table(customers, "churned", "reference")
    return suggest_contract(typed, kinds, "churned")


def test_suggestion_covers_every_column_and_passes_its_reference(customers, suggested):
    assert set(suggested.columns) == set(customers.columns)
    assert suggested.classes == ["no", "yes"] and 0 < suggested.min_class_share < 0.2
    assert suggested.columns["plan"].categories == sorted(customers["plan"].dropna().unique())
    age = suggested.columns["customer age"]
    assert age.min <= customers["customer age"].min() and age.max >= customers["customer age"].max()
    prepared = prepare_tables(customers, "churned", "reference", PrepareParams(), suggested)
    frame = pd.concat([prepared.train, prepared.val, prepared.holdout], ignore_index=True)
    gate, _ = validate_frames({"all": frame}, prepared.schema, ValidateParams(), contract=suggested)
    assert gate.status == "pass", gate.reasons


def test_contract_types_win_over_inference(customers, suggested):
    raw = customers.astype(object).astype(str).where(customers.notna(), None)
    raw.index = range(2, len(raw) + 2)
    raw.loc[5, "tenure_months"] = "twelve"
    with pytest.raises(DataError, match=r"'tenure_months' must be numeric.*line 5"):
        parse_with_contract(raw, suggested, "batch.csv")


def test_missing_declared_column_is_named(customers, suggested):
    with pytest.raises(DataError, match=r"\['region'\] are missing"):
        parse_with_contract(customers.drop(columns=["region"]), suggested, "batch.csv")


def test_out_of_range_and_unseen_category_fail_with_counts(customers, suggested):
    bad = customers.copy()
    bad.loc[bad.index[:7], "customer age"] = 999
    bad.loc[bad.index[:2], "plan"] = "platinum"
    prepared = prepare_tables(bad, "churned", "batch", PrepareParams(), suggested)
    frame = pd.concat([prepared.train, prepared.val, prepared.holdout], ignore_index=True)
    gate, _ = validate_frames({"all": frame}, prepared.schema, ValidateParams(), contract=suggested)
    text = " ".join(gate.reasons)
    assert gate.status == "fail"
    assert "between on 'customer age' (7 offending rows" in text
    assert "in_set on 'plan' (2 offending rows" in text and "platinum" in text


def test_a_rule_that_contradicts_its_type_is_refused():
    with pytest.raises(ValidationError):
        ColumnRule(type="numeric", categories=["a"])


def test_infinite_numbers_are_refused_by_column_and_line(customers):
    raw = customers.astype(object).astype(str).where(customers.notna(), None)
    raw.index = range(2, len(raw) + 2)
    raw.loc[7, "monthly charges ($)"] = "inf"
    with pytest.raises(DataError, match=r"'monthly charges \(\$\)' must be numeric.*line 7: 'inf'"):
        parse_table(raw, "churned", "batch.csv")


def test_ingest_door_gate_lists_every_problem(customers, suggested, tmp_path):
    """The batch gate's gate JSON has one reason per problem: a ragged row and text in two numeric columns."""
    from tasks.core.params_spec import Params
    from tasks.modalities.table.batches import judge_batch

    path = tmp_path / "batch.csv"
    customers.head(50).to_csv(path, index=False)
    lines = path.read_text().splitlines()
    lines[3] += ",extra"
    lines[5] = "abc," + lines[5].split(",", 1)[1]                       # customer age, line 6
    lines[7] = ",".join(["x" if i == 1 else c for i, c in enumerate(lines[7].split(","))])  # tenure, line 8
    path.write_text("\n".join(lines) + "\n")
    gate, typed = judge_batch(path, suggested, default_params())
    assert gate.status == "fail" and typed is None and len(gate.reasons) == 3
    text = "\n".join(gate.reasons)
    assert "ragged rows" in text and "line 4: 13 fields" in text
    assert "'customer age' must be numeric" in text and "line 6: 'abc'" in text
    assert "'tenure_months' must be numeric" in text and "line 8: 'x'" in text
