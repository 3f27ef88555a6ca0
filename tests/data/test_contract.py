"""tasks/modalities/table/parse.py: strict reading and typing of raw tables; tasks/modalities/table/encoding.py: the one row encoding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tasks.modalities.table.parse import parse_table
from tasks.core.labels import class_labels
from tasks.modalities.table.encoding import encode_features
from tasks.core.labels import encode_target
from tasks.core.errors import DataError
from tasks.core.params_spec import ValidateParams
from tasks.core.problems import SHOWN, DataProblems
from tasks.core.schema_spec import Feature, Schema, schema_from_metadata
from tasks.modalities.table.files import read_raw_table, read_table


def write_csv(folder: Path, text: str, name: str = "rows.csv") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def numeric_csv(rows: int = 40, bad_row: int | None = None, bad_value: str = "abc") -> str:
    """A tidy table; optionally one non-number in the numeric column `age` (data row index `bad_row`)."""
    lines = ["age,plan,label"]
    for i in range(rows):
        age = bad_value if i == bad_row else str(20 + i)
        lines.append(f"{age},{'basic' if i % 2 else 'premium'},{'yes' if i % 3 else 'no'}")
    return "\n".join(lines) + "\n"

# read_raw_table


def test_rows_keep_their_file_line_numbers(tmp_path):
    path = write_csv(tmp_path, "a,label\n1,x\n\n2,y\n3,x\n")
    table = read_raw_table(path)
    assert list(table.index) == [2, 4, 5]
    assert list(table["a"]) == ["1", "2", "3"]  # all cells as text until parse_table types them


def test_ragged_row_names_its_line(tmp_path):
    path = write_csv(tmp_path, "a,b,label\n1,2,x\n\n3,4,5,y\n")
    with pytest.raises(DataError, match=r"ragged rows \(rule: every row has the header's 3 fields\): "
                                        r"1 offending \(line 4: 4 fields\)"):
        read_raw_table(path)


def test_empty_file(tmp_path):
    with pytest.raises(DataError, match="empty"):
        read_raw_table(write_csv(tmp_path, ""))


def test_binary_garbage_is_not_a_valid_csv(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(bytes(np.random.default_rng(0).integers(128, 256, 300, dtype=np.uint8)))
    with pytest.raises(DataError, match="not a valid CSV"):
        read_raw_table(path)


def test_header_only(tmp_path):
    with pytest.raises(DataError, match="no data rows"):
        read_raw_table(write_csv(tmp_path, "a,b,label\n"))


def test_duplicate_column_names_are_named(tmp_path):
    with pytest.raises(DataError, match=r"repeats column names \['a'\] on line 1"):
        read_raw_table(write_csv(tmp_path, "a,b,a,label\n1,2,3,x\n"))


def test_missing_file_points_at_data_source(tmp_path):
    with pytest.raises(DataError, match="data.source"):
        read_raw_table(tmp_path / "nope.csv")


def test_parquet_rows_are_numbered_from_one(tmp_path):
    path = tmp_path / "rows.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "label": ["x", "y"]}).to_parquet(path)
    assert list(read_raw_table(path).index) == [1, 2]

# parse_table


def test_text_in_a_numeric_column_names_column_and_line(tmp_path):
    raw = read_raw_table(write_csv(tmp_path, numeric_csv(bad_row=7)))
    with pytest.raises(DataError) as caught:
        parse_table(raw, "label", "rows.csv")
    message = str(caught.value)
    assert "column 'age'" in message and "line 9: 'abc'" in message  # data row 7 is file line 9


def test_numeric_and_categorical_kinds_are_inferred(tmp_path):
    typed, kinds = parse_table(read_raw_table(write_csv(tmp_path, numeric_csv())), "label", "rows.csv")
    assert kinds == {"age": "numeric", "plan": "categorical"}
    assert typed["age"].dtype == np.float64 and typed["age"].iloc[0] == 20.0


def test_mostly_text_column_is_categorical():
    raw = pd.DataFrame({"code": ["A1", "B2", "7", "C3", "D4", "8"] * 5, "label": ["x", "y"] * 15})
    typed, kinds = parse_table(raw, "label", "t")
    assert kinds["code"] == "categorical"
    assert set(typed["code"]) == {"A1", "B2", "7", "C3", "D4", "8"}


def test_empty_cells_in_a_numeric_column_are_missing_not_violations(tmp_path):
    text = numeric_csv().replace("\n25,", "\n,", 1)
    typed, kinds = parse_table(read_raw_table(write_csv(tmp_path, text)), "label", "rows.csv")
    assert kinds["age"] == "numeric" and typed["age"].isna().sum() == 1


def test_column_names_with_spaces_and_punctuation_survive(tmp_path):
    path = write_csv(tmp_path, 'customer age,"monthly charges ($)",payment method,label\n'
                               "30,9.5,bank transfer,yes\n40,19.5,card,no\n50,29.5,card,yes\n")
    typed, kinds = parse_table(read_raw_table(path), "label", "rows.csv")
    assert list(typed.columns) == ["customer age", "monthly charges ($)", "payment method", "label"]
    assert kinds == {"customer age": "numeric", "monthly charges ($)": "numeric", "payment method": "categorical"}


def test_missing_target_column_is_named():
    raw = pd.DataFrame({"a": ["1", "2"], "b": ["x", "y"]})
    with pytest.raises(DataError, match="target column 'churn' does not exist"):
        parse_table(raw, "churn", "t")


def test_regression_target_is_refused():
    rng = np.random.default_rng(0)
    raw = pd.DataFrame({"a": rng.normal(size=50).astype(str), "price": rng.normal(100, 20, 50).round(3).astype(str)})
    with pytest.raises(DataError, match="regression"):
        parse_table(raw, "price", "t")


def test_many_integer_labels_count_as_regression():
    raw = pd.DataFrame({"a": ["1"] * 300, "y": [str(i) for i in range(300)]})
    with pytest.raises(DataError, match="regression"):
        parse_table(raw, "y", "t")


def test_integer_labels_are_a_classification_target():
    raw = pd.DataFrame({"a": ["1", "2", "3", "4"], "y": ["0", "1", "2", "1"]})
    parse_table(raw, "y", "t")  # no error


def test_single_class_target_is_refused():
    raw = pd.DataFrame({"a": ["1", "2", "3"], "y": ["yes", "yes", "yes"]})
    with pytest.raises(DataError, match="single class"):
        parse_table(raw, "y", "t")


def test_empty_target_cells_name_their_lines(tmp_path):
    raw = read_raw_table(write_csv(tmp_path, "a,label\n1,x\n2,\n3,y\n"))
    with pytest.raises(DataError, match=r"line 3: ''"):
        parse_table(raw, "label", "rows.csv")

# encoding


@pytest.fixture
def schema() -> Schema:
    return Schema(source="t", target="label", classes=["no", "yes"], features=[
        Feature(name="age", kind="numeric"),
        Feature(name="plan", kind="categorical", categories=["basic", "premium"]),
    ])


def test_encode_features_codes_known_categories_from_one(schema):
    rows = pd.DataFrame({"age": [30.0, 41.5], "plan": ["basic", "premium"]})
    np.testing.assert_array_equal(encode_features(rows, schema), np.array([[30.0, 1], [41.5, 2]], dtype=np.float32))


def test_encode_features_maps_unseen_and_missing_to_zero_and_keeps_nan(schema):
    rows = pd.DataFrame({"age": [np.nan, None, 5.0], "plan": ["gold", None, np.nan]})
    matrix = encode_features(rows, schema)
    assert matrix.dtype == np.float32 and matrix.shape == (3, 2)
    assert np.isnan(matrix[:2, 0]).all() and matrix[2, 0] == 5.0
    np.testing.assert_array_equal(matrix[:, 1], [0, 0, 0])


def test_encode_features_ignores_column_order_and_extras(schema):
    rows = pd.DataFrame({"extra": [1], "plan": ["premium"], "age": [3.0]})
    np.testing.assert_array_equal(encode_features(rows, schema), [[3.0, 2.0]])


def test_encode_features_refuses_a_missing_feature(schema):
    with pytest.raises(DataError, match="plan"):
        encode_features(pd.DataFrame({"age": [1.0]}), schema)


def test_encode_target(schema):
    np.testing.assert_array_equal(encode_target(pd.Series(["yes", "no", "yes"]), schema), [1, 0, 1])


def test_encode_target_refuses_an_unknown_label(schema):
    with pytest.raises(DataError, match=r"\['maybe'\]"):
        encode_target(pd.Series(["yes", "maybe"]), schema)


def test_class_labels_sort_numbers_numerically():
    assert class_labels(pd.Series(["10", "2", "1", "2"])) == ["1", "2", "10"]
    assert class_labels(pd.Series([10, 2, 1])) == ["1", "2", "10"]


def test_class_labels_sort_text():
    assert class_labels(pd.Series(["yes", "no", "maybe"])) == ["maybe", "no", "yes"]


def test_numeric_labels_encode_in_the_same_text_form():
    labels = pd.Series([10.0, 2.0, 1.0])
    schema = Schema(source="t", target="y", classes=class_labels(labels), features=[])
    np.testing.assert_array_equal(encode_target(labels, schema), [2, 1, 0])


def test_schema_round_trips_through_metadata_json(schema):
    assert schema_from_metadata({"torchship.schema": schema.model_dump_json()}) == schema
    with pytest.raises(DataError, match="not exported by torchship"):
        schema_from_metadata({})

# one pass: every problem of a table in one refusal


def _problems(call) -> dict:
    with pytest.raises(DataProblems) as caught:
        call()
    return {(p.column, p.rule.split(" (")[0].split(":")[0]): p for p in caught.value.problems}


def test_structural_and_column_problems_are_refused_together(tmp_path):
    text = numeric_csv(rows=40, bad_row=3).replace("\n24,", "\n24,x,", 1)          # ragged
    path = tmp_path / "rows.csv"
    path.write_bytes(text.replace("age,plan,label", "age,plan,plan,label").replace(",basic,", ",basic,b,")
                     .replace(",premium,", ",premium,p,").encode().replace(b"\n30,", b"\n3\xe90,", 1))
    raw, found = read_table(path)
    problems = _problems(lambda: parse_table(raw, "label", "rows.csv", 0.2, found))
    assert set(problems) == {(None, "repeats column names ['plan'] on line 1"), (None, "has ragged rows"),
                             (None, "has lines that are not UTF-8 text"), ("age", "is mostly numeric")}
    assert problems[(None, "has ragged rows")].examples == ["line 6: 5 fields"]
    assert problems[("age", "is mostly numeric")].examples == ["line 5: 'abc'", "line 12: '3�0'"]


def test_every_offending_cell_is_counted_and_five_are_shown():
    raw = pd.DataFrame({"a": [str(i) for i in range(90)] + ["n/a?"] * 10, "label": ["x", "y"] * 50},
                       index=range(2, 102))
    problem = _problems(lambda: parse_table(raw, "label", "t", 0.2))[("a", "is mostly numeric")]
    assert problem.count == 10 and len(problem.examples) == SHOWN == 5
    assert problem.examples[0] == "line 92: 'n/a?'" and "10.0% of its 100 filled cells" in problem.rule
    message = problem.sentence()
    assert "10 offending (line 92: 'n/a?'" in message and ", ...)" in message
    assert "`'a': {type: categorical}`" in message and "contract" in message


def test_mostly_numeric_share_is_a_param():
    raw = pd.DataFrame({"a": [str(i) for i in range(90)] + ["text"] * 10, "label": ["x", "y"] * 50})
    with pytest.raises(DataProblems):
        parse_table(raw, "label", "t", max_non_numeric_share=0.1)
    assert parse_table(raw, "label", "t", max_non_numeric_share=0.09)[1]["a"] == "categorical"
    assert parse_table(raw, "label", "t", max_non_numeric_share=0.0)[1]["a"] == "categorical"
    assert ValidateParams().max_non_numeric_share >= 0.1   # the 90%-numbers column is refused by default
    with pytest.raises(DataProblems):
        parse_table(raw, "label", "t")


def test_target_problems_come_with_the_column_problems():
    raw = pd.DataFrame({"a": ["1", "2", "x", "4"], "b": ["1", "inf", "3", "4"], "label": ["y", None, "y", "y"]},
                       index=[2, 3, 4, 5])
    problems = _problems(lambda: parse_table(raw, "label", "t", 0.3))
    assert set(problems) == {("a", "is mostly numeric"), ("b", "must be numeric"),
                             ("label", "is empty as a target"), ("label", "has a single class")}


def test_undecodable_lines_are_named_and_the_rest_is_read(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(numeric_csv(rows=10).encode().replace(b"premium", b"pr\xe9mium"))
    table, found = read_table(path)
    assert len(table) == 10 and len(found) == 1
    assert found[0].count == 5 and found[0].examples[0].startswith("line 2, byte 6:")
