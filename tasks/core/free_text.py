"""Free text in a table: a column of mostly distinct strings of several words, which no model may encode as a
category. The table modality refuses such a column, naming it; the text modality reads it. One rule for both."""
from __future__ import annotations

import pandas as pd

# A free-text column, not a category: mostly distinct values, several words and more characters than a label
MIN_DISTINCT_SHARE, MIN_MEDIAN_CHARS, MIN_MEDIAN_WORDS, MIN_MEAN_WORDS = 0.5, 16, 4, 6


def text_columns(frame: pd.DataFrame) -> list[str]:
    """The columns that hold free text rather than a category or a number: strings, mostly distinct, with a median
    of at least MIN_MEDIAN_CHARS characters and MIN_MEDIAN_WORDS words (or a mean of MIN_MEAN_WORDS words)."""
    found = []
    for column in frame.columns:
        values = frame[column]
        if not (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)):
            continue
        cells = values[values.map(lambda v: isinstance(v, str))]
        cells = cells[cells.str.strip() != ""]
        if cells.empty or len(cells) < 0.5 * values.notna().sum():
            continue
        words = cells.str.split().str.len()
        if cells.nunique() >= MIN_DISTINCT_SHARE * len(cells) and cells.str.len().median() >= MIN_MEDIAN_CHARS \
                and (words.median() >= MIN_MEDIAN_WORDS or words.mean() >= MIN_MEAN_WORDS):
            found.append(str(column))
    return found
