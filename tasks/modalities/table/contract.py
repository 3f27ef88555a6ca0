"""The declared data contract (the `contract:` section of params.yaml): what each column may hold.

Written once (`torchship contract suggest DATA` proposes one from reference data, a human reviews it),
then used to judge every later table, batch and request. Without one, only the strict
types-and-parse rules of tasks/modalities/table/parse.py apply.
"""
from __future__ import annotations

import math
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.core.labels import label_strings

Severity = Literal["fail", "warn"]


class ColumnRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["numeric", "categorical"]
    nullable: bool = True
    max_null_share: float = Field(1.0, ge=0.0, le=1.0)
    min: float | None = Field(None, allow_inf_nan=False)   # a NaN bound would refuse every value, silently
    max: float | None = Field(None, allow_inf_nan=False)
    categories: list[str] | None = None
    on_violation: Severity = "fail"

    @model_validator(mode="after")
    def _fits_its_type(self) -> ColumnRule:
        if self.type == "numeric" and self.categories:
            raise ValueError("a numeric column has no categories")
        if self.type == "categorical" and (self.min is not None or self.max is not None):
            raise ValueError("a categorical column has no min/max")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no value could pass")
        return self


class Contract(BaseModel):
    """Per table: row count, key, target classes and their minimum share; per column: a ColumnRule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    classes: list[str] = Field(min_length=2)
    min_class_share: float = Field(0.0, ge=0.0, lt=1.0)
    min_rows: int = Field(1, ge=1)
    max_rows: int | None = None
    key: str | None = None
    columns: dict[str, ColumnRule] = Field(min_length=1)

    @property
    def features(self) -> list[str]:
        return [name for name in self.columns if name not in (self.target, self.key)]


def suggest_contract(typed: pd.DataFrame, kinds: dict[str, str], target: str, margin: float = 0.1,
                     max_categories: int = 50) -> Contract:
    """Profile reference data: observed ranges widened by `margin`, observed categories, null shares
    with head-room, and class shares halved; a starting point for a human to review."""
    columns: dict[str, ColumnRule] = {}
    for name, kind in kinds.items():
        values = typed[name]
        nulls = float(values.isna().mean())
        common = {"type": kind, "nullable": nulls > 0, "max_null_share": _ceil(min(1.0, nulls * 2 + 0.01), 2)
                  if nulls > 0 else 0.0}
        if kind == "numeric":
            low, high = float(values.min()), float(values.max())
            pad = (high - low) * margin
            floor = low - pad if low < 0 else max(0.0, low - pad)  # counts and amounts stay non-negative
            columns[name] = ColumnRule(**common, min=_round(floor), max=_round(high + pad))
        else:
            observed = values.dropna().astype(str).value_counts()
            columns[name] = ColumnRule(**common, categories=sorted(observed.index[:max_categories]),
                                       on_violation="warn" if len(observed) > max_categories else "fail")
    labels = label_strings(typed[target])  # the same text form prepare gives labels (1.0 -> "1")
    shares = labels.value_counts(normalize=True)
    columns[target] = ColumnRule(type="categorical", nullable=False, max_null_share=0.0,
                                 categories=sorted(shares.index))
    return Contract(target=target, classes=sorted(shares.index), min_class_share=_floor(shares.min() / 2, 3),
                    min_rows=max(1, len(typed) // 10), columns=columns)


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _ceil(value: float, digits: int) -> float:
    return math.ceil(value * 10 ** digits) / 10 ** digits


def _floor(value: float, digits: int) -> float:
    return math.floor(value * 10 ** digits) / 10 ** digits
