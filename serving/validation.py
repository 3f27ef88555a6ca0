"""Request rows checked against the model's own schema: a 422 names the row, the field and the rule."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from tasks.contract import Schema, normalise_category


def row_model(schema: Schema) -> type[BaseModel]:
    """The request row type, generated from the model's schema (and so from the data contract it was
    trained under): every feature present, typed, in range, in its category set, null only if allowed."""
    fields: dict[str, Any] = {}
    for i, feature in enumerate(schema.features):
        if feature.kind == "numeric":
            kind: Any = Annotated[float, Field(ge=feature.min, le=feature.max, allow_inf_nan=False)]
        elif feature.closed_categories:   # matched as the model matches it: " basic " is "basic"
            kind = Annotated[Literal[tuple(normalise_category(c) for c in feature.categories)],
                             BeforeValidator(lambda v: normalise_category(v) if isinstance(v, str) else v)]
        else:
            kind = str | int
        # Field names f0, f1, ... because column names need not be identifiers; the alias is the column.
        fields[f"f{i}"] = (kind | None if feature.nullable else kind, Field(..., alias=feature.name))
    return create_model("Row", __config__=ConfigDict(extra="forbid", strict=True), **fields)


def validate_rows(row_type: type[BaseModel], rows: list) -> list[dict]:
    """One problem per bad (row, field): {row, field, rule, message}; empty when every row is valid."""
    problems = []
    for index, row in enumerate(rows):
        try:
            row_type.model_validate(row)
        except ValidationError as exc:
            seen = set()
            for error in exc.errors():
                column = str(error["loc"][0]) if error["loc"] else "(row)"
                if column in seen:  # a union type reports once per member: one line per column is enough
                    continue
                seen.add(column)
                problems.append({"row": index, "field": column, "rule": error["type"], "message": error["msg"]})
    return problems
