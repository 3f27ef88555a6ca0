"""The retrain's door for the labelled production window: rows the model could not learn from are refused
one by one, with the reason per row, before the contract judges the rest."""
from __future__ import annotations

import pandas as pd

from tasks.core.schema_spec import Feature, Schema
from tasks.monitoring.window import Window
from tasks.modalities.table.batches import labelled_rows, screen_rows

SCHEMA = Schema(source="test", target="churned", classes=["no", "yes"],
                features=[Feature(name="age", kind="numeric"), Feature(name="plan", kind="categorical",
                                                                         categories=["basic", "premium"])])


def served(labels: list, ages: list, ts: list) -> Window:
    rows = pd.DataFrame({"id": [f"r-{i}" for i in range(len(labels))], "ts": ts, "variant": "champion",
                         "version": "1", "prediction": "no", "label": labels, "age": ages, "plan": "basic"})
    return Window(rows=rows, features=["age", "plan"], start=min(ts), end=max(ts))


def test_only_labelled_rows_in_the_time_range_are_taken():
    window = served(["yes", None, "no", "yes"], [30, 31, 32, 33], [10.0, 11.0, 12.0, 13.0])
    table = labelled_rows(window, "churned", since=10.0, until=12.0)
    assert table["age"].tolist() == [32] and table["churned"].tolist() == ["no"]
    assert table.index.tolist() == ["served row r-2"]


def test_a_label_that_is_not_a_class_and_text_in_a_numeric_feature_are_refused_per_row():
    window = served(["yes", "maybe", "no"], [30, 31, "thirty"], [1.0, 2.0, 3.0])
    good, bad = screen_rows(labelled_rows(window, "churned", since=0.0, until=9.0), SCHEMA)
    assert good["age"].tolist() == [30]
    assert bad["problem"].tolist() == ["churned: not one of the classes ['no', 'yes']", "age: not a number"]
    assert bad.index.tolist() == ["served row r-1", "served row r-2"]
