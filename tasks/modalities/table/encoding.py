"""The row encoding: raw rows -> the float matrix (and labels -> class indices) a model takes, by its schema.

Training, export, the pipeline's scoring and the service all encode with this one module.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.schema_spec import Feature, Schema

UNKNOWN_CODE = 0  # code of a missing or unseen category; known categories are 1..K


def _require_features(rows: pd.DataFrame, schema: Schema) -> None:
    missing = [f.name for f in schema.features if f.name not in rows.columns]
    if missing:
        raise DataError(f"rows lack feature column(s) {missing}: every feature in the schema must be present.")



def raw_columns(rows: pd.DataFrame, schema: Schema) -> dict[str, np.ndarray]:
    """Raw rows -> one 1-D array per feature, as a raw-input graph takes them (tasks/modalities/table/graph.py):
    numbers float64 (unparseable or missing = NaN), categories as text (missing = "", which codes as unknown)."""
    _require_features(rows, schema)
    return {f.name: pd.to_numeric(rows[f.name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            if f.kind == "numeric" else rows[f.name].astype("string").fillna("").to_numpy(dtype=object)
            for f in schema.features}



def normalise_category(text: str) -> str:
    """Category text as it is matched: Python's whitespace (str.split) stripped at the ends and collapsed
    inside to one space, so " bank  transfer" is "bank transfer". A served graph applies the same rule."""
    return " ".join(text.split())



def category_lookup(feature: Feature) -> dict[str, int]:
    """Normalised category -> code, 1..K in schema order; the first wins when two normalise alike, and a
    blank never matches (it is missing: UNKNOWN_CODE)."""
    lookup: dict[str, int] = {}
    for code, category in enumerate(feature.categories, start=1):
        if key := normalise_category(category):
            lookup.setdefault(key, code)
    return lookup



def encode_features(rows: pd.DataFrame, schema: Schema) -> np.ndarray:
    """Raw rows -> float32 matrix: `raw_columns`, then numbers as-is (NaN = missing) and categories as codes
    by `category_lookup` after `normalise_category` (0 = unknown, missing or blank), as a raw-input graph does."""
    columns = raw_columns(rows, schema)
    matrix = np.empty((len(rows), len(schema.features)), dtype=np.float32)
    for j, feature in enumerate(schema.features):
        values = columns[feature.name]
        if feature.kind == "categorical":
            values = pd.Series(values).map(normalise_category).map(category_lookup(feature)).fillna(UNKNOWN_CODE)
        with np.errstate(over="ignore"):   # beyond float32's range is +-inf, as a graph's Cast makes it
            matrix[:, j] = values
    return matrix
