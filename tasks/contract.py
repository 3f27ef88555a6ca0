"""The data contract: strict parsing of raw tables, the feature schema, and the row encoding.

The schema travels with every model (inside the ONNX file's metadata), so training, export and
serving all turn raw rows into the model's float matrix with this one module.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel

from tasks.core.csv_table import read_csv_table
from tasks.core.errors import DataError
from tasks.core.problems import SHOWN, Problem, line_examples, raise_if_any

# A numeric target with more distinct values than this is a regression target.
MAX_NUMERIC_CLASSES = 100
UNKNOWN_CODE = 0  # code of a missing or unseen category; known categories are 1..K


class Feature(BaseModel):
    name: str
    kind: Literal["numeric", "categorical"]
    categories: list[str] = []
    # From the declared contract, when there is one: what a served request may hold.
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    closed_categories: bool = False   # an unseen category is refused (not mapped to "unknown")


class Schema(BaseModel):
    """What a model expects: ordered features, the target and its class labels."""

    source: str
    target: str
    classes: list[str]
    features: list[Feature]

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    def signature(self) -> list[tuple[str, str]]:
        """Input signature: names and kinds; two models are comparable only if these match."""
        return [(f.name, f.kind) for f in self.features]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Schema":
        return cls.model_validate_json(text)


def _require_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"data file {path} not found: check data.source in params.yaml (a CSV or Parquet path, "
                        "`synthetic`, or `sklearn:<name>`).")


def table_columns(path: Path) -> list[str] | None:
    """The column names from the file's header alone (None if the header cannot be read: the full parse will
    say why). Cheap, for checks that should fail in a second rather than after minutes."""
    _require_file(path)
    try:
        if path.suffix.lower() in {".parquet", ".pq"}:
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), None)
    except Exception:  # unreadable: read_raw_table gives the precise message
        return None


def require_target(columns, target: str, origin: str) -> None:
    if target not in columns:
        raise DataError(f"{origin}: target column '{target}' does not exist (columns: "
                        f"{', '.join(map(str, list(columns)[:20]))}). Set data.target to one of them.")


def read_table(path: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """Read a CSV (all cells as text) or Parquet file, index = each row's file line (Parquet: row number);
    plus every structural problem found (ragged rows, undecodable lines, duplicate names), for the caller to
    report with the column problems in one refusal."""
    _require_file(path)
    if path.suffix.lower() not in {".parquet", ".pq"}:
        return read_csv_table(path)
    if path.stat().st_size == 0:
        raise_if_any(str(path), [Problem("is empty (rule: a Parquet file with rows)", 1)])
    try:
        table = pd.read_parquet(path)
    except Exception as exc:
        raise DataError(f"{path} is not a valid Parquet file ({type(exc).__name__}: {exc}).") from None
    table.index = pd.RangeIndex(1, len(table) + 1)  # Parquet has rows, not lines
    return table, []


def read_raw_table(path: Path) -> pd.DataFrame:
    """`read_table`, refusing the file (with every structural problem) when it has any."""
    table, problems = read_table(path)
    raise_if_any(str(path), problems)
    return table


def parse_table(raw: pd.DataFrame, target: str, origin: str, max_non_numeric_share: float | None = None,
                found: list[Problem] = ()) -> tuple[pd.DataFrame, dict[str, str]]:
    """Strictly type a raw table: numbers where a column is numeric, text elsewhere. A column whose share of
    non-numeric cells is above 0 but at most `max_non_numeric_share` is "mostly numeric" and refused (0: such a
    column is text; None: the params default). Every problem (with those already `found` while reading) is reported in one refusal.

    Returns the typed table (index still holds file lines) and each feature's kind.
    """
    require_target(raw.columns, target, origin)
    if len(raw.columns) < 2:
        raise DataError(f"{origin}: only the target column is present; at least one feature column is needed.")
    if max_non_numeric_share is None:
        from tasks.config import ValidateParams

        max_non_numeric_share = ValidateParams().max_non_numeric_share
    problems = list(found)
    typed = pd.DataFrame(index=raw.index)
    kinds: dict[str, str] = {}
    for column in raw.columns:
        values = raw[column]
        if column == target:
            typed[column] = values
            continue
        kind, parsed = _parse_column(values, str(column), problems, max_non_numeric_share=max_non_numeric_share)
        typed[column] = parsed
        kinds[str(column)] = kind
    problems += target_problems(typed[target], target)
    raise_if_any(origin, problems)
    return typed, kinds


def parse_with_contract(raw: pd.DataFrame, contract, origin: str,
                        found: list[Problem] = ()) -> tuple[pd.DataFrame, dict[str, str], list[str]]:
    """Type a raw table by the declared contract (never by inference): every declared column must be
    there, and every cell of a numeric column must parse. Returns typed table, feature kinds, dropped columns;
    every problem (with those already `found`) is reported in one refusal."""
    problems = list(found)
    missing = [name for name in contract.columns if name not in raw.columns]
    if missing:
        problems.append(Problem(f"lacks column(s): {missing} are missing (rule: required by the contract)", len(raw),
                                fix="Add them, or change the contract in params.yaml."))
    typed = pd.DataFrame(index=raw.index)
    kinds: dict[str, str] = {}
    for name, rule in contract.columns.items():
        if name in missing:
            continue
        if name == contract.target:
            typed[name] = raw[name]
            continue
        kind, parsed = _parse_column(raw[name], name, problems, forced=rule.type)
        typed[name] = parsed
        if name != contract.key:
            kinds[name] = kind
    if contract.target not in missing:
        problems += target_problems(typed[contract.target], contract.target)
    raise_if_any(origin, problems)
    return typed, kinds, [c for c in raw.columns if c not in contract.columns]


def _parse_column(values: pd.Series, column: str, problems: list[Problem], forced: str | None = None,
                  max_non_numeric_share: float = 0.0) -> tuple[str, pd.Series]:
    """Kind and typed values of one column; what breaks its rule is added to `problems`."""
    if forced == "categorical":
        return "categorical", values.astype("string").str.strip()
    if forced == "numeric":
        return "numeric", _strict_numbers(values, column, "contract type numeric", problems)
    if pd.api.types.is_bool_dtype(values):
        return "categorical", values.astype("string")
    if pd.api.types.is_numeric_dtype(values):
        return "numeric", _strict_numbers(values.astype("float64"), column, "finite numbers", problems)
    present = values.dropna()
    if present.empty:
        return "numeric", pd.Series(np.nan, index=values.index, dtype="float64")
    text_share = float(pd.to_numeric(present, errors="coerce").isna().mean())
    if text_share == 0:
        return "numeric", _strict_numbers(values, column, "finite numbers", problems)
    if text_share <= max_non_numeric_share:
        problems.append(_mostly_numeric(present, column, text_share, max_non_numeric_share))
        return "numeric", pd.to_numeric(values, errors="coerce").astype("float64")
    return "categorical", values.astype("string").str.strip()


def _mostly_numeric(present: pd.Series, column: str, share: float, limit: float) -> Problem:
    """A column of numbers with a few text cells: a typo to fix, or a text column to declare, never a silent
    switch to categorical."""
    bad = present[pd.to_numeric(present, errors="coerce").isna()]
    return Problem(f"is mostly numeric (rule: validate.max_non_numeric_share {limit:g}): {share:.1%} of its "
                   f"{len(present)} filled cells are not numbers", len(bad),
                   column=column, examples=line_examples(bad.items()),
                   fix=("If it holds numbers, fix those cells or leave them empty (missing). If it holds codes or "
                        f"text, declare it in the data contract in params.yaml: under `contract:` `columns:` write "
                        f"`'{column}': {{type: categorical}}` (`torchship contract suggest DATA` proposes the whole "
                        "section)."))


def _strict_numbers(values: pd.Series, column: str, rule: str, problems: list[Problem]) -> pd.Series:
    """Every non-empty cell must parse as a finite number; the ones that do not are one problem."""
    present = values.dropna()
    numbers = pd.to_numeric(present, errors="coerce")
    bad = present[numbers.isna() | np.isinf(numbers.astype("float64"))]  # "inf" parses, but is no measurement
    if len(bad):
        problems.append(Problem(f"must be numeric (rule: {rule}; every filled cell a finite number)", len(bad),
                                column=column, examples=line_examples(bad.items()),
                                fix="Fix or remove those rows, or leave the cells empty for missing."))
    return pd.to_numeric(values, errors="coerce").astype("float64")


def check_classification_target(target: pd.Series, name: str, origin: str) -> None:
    """Refuse a target torchship cannot train a classifier on."""
    raise_if_any(origin, target_problems(target, name))


def target_problems(target: pd.Series, name: str) -> list[Problem]:
    """What makes a column unusable as a classifier's target: empty labels, numbers that are a regression
    target, a single class."""
    problems = []
    missing = target[target.isna()]
    if len(missing):
        problems.append(Problem("is empty as a target (rule: every training row has a label)", len(missing), column=name,
                                examples=line_examples((line, "") for line in missing.index),
                                fix="Remove or label those rows."))
    present = target.dropna()
    numbers = pd.to_numeric(present, errors="coerce")
    if len(present) and numbers.notna().all():
        distinct = numbers.nunique()
        if bool((numbers != numbers.round()).any()) or distinct > MAX_NUMERIC_CLASSES:
            example = ", ".join(str(v) for v in numbers.drop_duplicates().head(3))
            problems.append(Problem(f"is not a classification target: {distinct} distinct numeric values (e.g. {example}) "
                                    "make a regression target, and torchship trains classifiers only",
                                    len(present), column=name, fix="Choose a categorical column as data.target, "
                                    "or bin the values into classes first."))
    if present.nunique() < 2:
        label = present.iloc[0] if len(present) else None
        problems.append(Problem(f"has a single class ({label!r}); a classifier needs at least two",
                                len(present), column=name, fix="Check the data or data.target."))
    return problems


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


def build_schema(train: pd.DataFrame, kinds: dict[str, str], target: str, classes: list[str],
                 source: str, max_categories: int, contract=None) -> Schema:
    """Fit the category vocabularies on the training split only (a contract's declared categories win)."""
    features = []
    for name, kind in kinds.items():
        rule = contract.columns.get(name) if contract else None
        categories: list[str] = []
        if kind == "categorical":
            if rule is not None and rule.categories:
                categories = list(rule.categories)
            else:
                counts = train[name].dropna().value_counts()
                categories = sorted(str(c) for c in counts.index[:max_categories])
        limits = {} if rule is None else {
            "min": rule.min, "max": rule.max, "nullable": rule.nullable,
            "closed_categories": bool(rule.categories) and rule.on_violation == "fail"}
        features.append(Feature(name=name, kind=kind, categories=categories, **limits))
    return Schema(source=source, target=target, classes=classes, features=features)


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


def _require_features(rows: pd.DataFrame, schema: Schema) -> None:
    missing = [f.name for f in schema.features if f.name not in rows.columns]
    if missing:
        raise DataError(f"rows lack feature column(s) {missing}: every feature in the schema must be present.")


def raw_columns(rows: pd.DataFrame, schema: Schema) -> dict[str, np.ndarray]:
    """Raw rows -> one 1-D array per feature, as a raw-input graph takes them (tasks/variants/preprocess.py):
    numbers float64 (unparseable or missing = NaN), categories as text (missing = "", which codes as unknown)."""
    _require_features(rows, schema)
    return {f.name: pd.to_numeric(rows[f.name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            if f.kind == "numeric" else rows[f.name].astype("string").fillna("").to_numpy(dtype=object)
            for f in schema.features}


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


def encode_target(target: pd.Series, schema: Schema) -> np.ndarray:
    """Labels -> class indices; an unknown label is a contract violation."""
    lookup = {c: i for i, c in enumerate(schema.classes)}
    codes = label_strings(target).map(lookup)
    if codes.isna().any():
        unknown = sorted(set(label_strings(target)[codes.isna()]))[:SHOWN]
        raise DataError(f"target '{schema.target}' has label(s) {unknown} not among the trained classes {schema.classes}.")
    return codes.to_numpy(dtype=np.int64)


def load_schema(path: Path) -> Schema:
    return Schema.from_json(Path(path).read_text())


def schema_from_metadata(metadata: dict[str, str]) -> Schema:
    """The schema an exported ONNX model carries in its metadata."""
    if "torchship.schema" not in metadata:
        raise DataError("model file carries no torchship schema: it was not exported by torchship.")
    return Schema.model_validate(json.loads(metadata["torchship.schema"]))
