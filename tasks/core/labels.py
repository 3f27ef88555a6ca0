"""Class labels as text, and labels -> class indices by a model's schema: the one label rule every modality
shares (a table's target column, an image's class folder, a text's label)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.problems import SHOWN
from tasks.core.schema_spec import Schema


def class_labels(target: pd.Series) -> list[str]:
    """Sorted class labels as text (numerically when the labels are numbers)."""
    numbers = pd.to_numeric(target, errors="coerce")
    if numbers.notna().all():
        return [str(int(v)) for v in sorted(numbers.unique())]
    return sorted(target.astype(str).unique())



def label_strings(target: pd.Series) -> pd.Series:
    """Labels in the same text form as `class_labels`."""
    numbers = pd.to_numeric(target, errors="coerce")
    if numbers.notna().all():
        return numbers.astype("int64").astype(str)
    return target.astype(str)


def encode_target(target: pd.Series, schema: Schema) -> np.ndarray:
    """Labels -> class indices; an unknown label is a contract violation."""
    lookup = {c: i for i, c in enumerate(schema.classes)}
    codes = label_strings(target).map(lookup)
    if codes.isna().any():
        unknown = sorted(set(label_strings(target)[codes.isna()]))[:SHOWN]
        raise DataError(f"target '{schema.target}' has label(s) {unknown} "
                        f"not among the trained classes {schema.classes}.")
    return codes.to_numpy(dtype=np.int64)
