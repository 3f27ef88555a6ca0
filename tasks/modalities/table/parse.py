"""Strict parsing of raw tables by the params (or the declared contract), and the feature schema built from the
training split. The contract's spec is tasks/modalities/table/contract.py, the row encoding
tasks/modalities/table/encoding.py and the table readers tasks/modalities/table/files.py."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core.errors import DataError
from tasks.core.free_text import text_columns
from tasks.core.params_spec import MAX_NON_NUMERIC_SHARE
from tasks.core.problems import Problem, line_examples, raise_if_any
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.table.contract import Contract
from tasks.modalities.table.files import require_target

# A numeric target with more distinct values than this is a regression target.
MAX_NUMERIC_CLASSES = 100
FREE_TEXT_SAMPLE = 1000   # rows a column is judged free text on



def parse_table(raw: pd.DataFrame, target: str, origin: str,
                max_non_numeric_share: float = MAX_NON_NUMERIC_SHARE,
                found: list[Problem] = ()) -> tuple[pd.DataFrame, dict[str, str]]:
    """Strictly type a raw table: numbers where a column is numeric, text elsewhere. A column whose share of
    non-numeric cells is above 0 but at most `max_non_numeric_share` is "mostly numeric" and refused (0: such a
    column is text; default: validate.max_non_numeric_share's). Every problem (with those already `found` while
    reading) is reported in one refusal.

    Returns the typed table (index still holds file lines) and each feature's kind.
    """
    require_target(raw.columns, target, origin)
    if len(raw.columns) < 2:
        raise DataError(f"{origin}: only the target column is present; at least one feature column is needed.")
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
    problems += free_text_problems(raw, kinds, target)
    problems += target_problems(typed[target], target)
    raise_if_any(origin, problems)
    return typed, kinds


def free_text_problems(raw: pd.DataFrame, kinds: dict[str, str], target: str) -> list[Problem]:
    """A column of free text (tasks/core/free_text.py) is never encoded as a category: it is named, with the way to
    train on its texts."""
    categorical = [c for c in raw.columns if kinds.get(str(c)) == "categorical"]
    sample = raw[categorical].head(FREE_TEXT_SAMPLE)
    return [Problem("holds free text, not categories (rule: a text column is never encoded as a category)",
                    len(raw), column=column, examples=line_examples(raw[column].head(2).items()),
                    fix=f"Train on its texts: torchship run --set data.modality=text --set data.target={target} "
                        f"--set text.text_column={column} (docs/text.md); or drop the column.")
            for column in text_columns(sample)]



def parse_with_contract(raw: pd.DataFrame, contract: Contract, origin: str,
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
        problems.append(Problem("is empty as a target (rule: every training row has a label)", len(missing),
                                column=name, examples=line_examples((line, "") for line in missing.index),
                                fix="Remove or label those rows."))
    present = target.dropna()
    numbers = pd.to_numeric(present, errors="coerce")
    if len(present) and numbers.notna().all():
        distinct = numbers.nunique()
        if bool((numbers != numbers.round()).any()) or distinct > MAX_NUMERIC_CLASSES:
            example = ", ".join(str(v) for v in numbers.drop_duplicates().head(3))
            problems.append(Problem(f"is not a classification target: {distinct} distinct numeric values "
                                    f"(e.g. {example}) make a regression target, and torchship trains classifiers only",
                                    len(present), column=name, fix="Choose a categorical column as data.target, "
                                    "or bin the values into classes first."))
    if present.nunique() < 2:
        label = present.iloc[0] if len(present) else None
        problems.append(Problem(f"has a single class ({label!r}); a classifier needs at least two",
                                len(present), column=name, fix="Check the data or data.target."))
    return problems



def build_schema(train: pd.DataFrame, kinds: dict[str, str], target: str, classes: list[str],
                 source: str, max_categories: int, contract: Contract | None = None) -> Schema:
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
