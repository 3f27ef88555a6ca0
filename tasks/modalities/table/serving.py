"""Request rows checked against the model's own schema: a 422 names the row, the field and the rule.

Two checkers come from one schema (and so from the data contract the model was trained under):
- `row_model`: a pydantic model that reports every problem with its rule (`missing`, `less_than_equal`,
  `literal_error`, `finite_number`, `float32_range`, ...), the 422's wording and the OpenAPI schema of a row;
- `RowDecoder`: a msgspec type that parses and checks a whole request body in one pass in C. It accepts no row
  that `row_model` refuses (tests/unit/test_row_decoder.py holds them to that); what it refuses (and what it
  cannot parse: NaN, whitespace around a closed category) goes to `row_model`, whose verdict stands.
"""
from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model
from pydantic_core import PydanticCustomError

from tasks.core.refusals import BodyRefused, RowsRefused, validate_rows
from tasks.core.schema_spec import Schema
from tasks.modalities.table.encoding import normalise_category

ROWS_SHAPE = "body must be {\"rows\": [{feature: value, ...}, ...]} with at least one row"
# The model computes in float32 (a graph's Cast, tasks.modalities.table.encoding.encode_features): a finite double
# beyond its range (1e40) would become inf there, and the answer NaN. Requests are held to float32's range, like a
# contract's bounds.
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_RULE = "float32_range"
# An integer given for a category is logged as a JSON number (orjson, msgspec: 64-bit integers): 2**64 is refused,
# not a 500 when its row is logged.
INT64 = (-(2**63), 2**63 - 1)


def row_model(schema: Schema) -> type[BaseModel]:
    """The request row type, generated from the model's schema: every feature present, typed, in range, in its
    category set, null only if allowed."""
    fields: dict[str, Any] = {}
    for i, feature in enumerate(schema.features):
        if feature.kind == "numeric":
            kind: Any = Annotated[float, Field(ge=feature.min, le=feature.max, allow_inf_nan=False,
                                               json_schema_extra=_float32_bounds(feature)),
                                  AfterValidator(_within_float32)]
        elif feature.closed_categories:   # matched as the model matches it: " basic " is "basic"
            kind = Annotated[Literal[tuple(normalise_category(c) for c in feature.categories)],
                             BeforeValidator(lambda v: normalise_category(v) if isinstance(v, str) else v)]
        else:
            kind = str | Annotated[int, Field(ge=INT64[0], le=INT64[1])]
        # Field names f0, f1, ... because column names need not be identifiers; the alias is the column.
        fields[f"f{i}"] = (kind | None if feature.nullable else kind, Field(..., alias=feature.name))
    return create_model("Row", __config__=ConfigDict(extra="forbid", strict=True), **fields)


def _within_float32(value: float) -> float:
    if abs(value) > FLOAT32_MAX:
        raise PydanticCustomError(FLOAT32_RULE, "Input should be within +-{limit:.7g}: the model computes in float32, "
                                  "where {value} would be infinite", {"limit": FLOAT32_MAX, "value": value})
    return value


def _float32_bounds(feature) -> dict:
    """The float32 range in the OpenAPI schema, where the contract sets no tighter bound."""
    bounds = {}
    if feature.min is None:
        bounds["minimum"] = -FLOAT32_MAX
    if feature.max is None:
        bounds["maximum"] = FLOAT32_MAX
    return bounds


def _fast_type(feature) -> Any:
    """The msgspec type of one feature: no looser than `row_model`'s (closed categories only in their
    normalised spelling, numbers within float32's range)."""
    if feature.kind == "numeric":
        low = -FLOAT32_MAX if feature.min is None else max(feature.min, -FLOAT32_MAX)
        high = FLOAT32_MAX if feature.max is None else min(feature.max, FLOAT32_MAX)
        kind: Any = Annotated[float, msgspec.Meta(ge=low, le=high)]
    elif feature.closed_categories:
        kind = Literal[tuple(normalise_category(c) for c in feature.categories)]
    else:
        kind = str | Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])]
    return kind | None if feature.nullable else kind


def _getter(get: Callable, keys: list[str]) -> Callable[[Any], tuple]:
    """attrgetter/itemgetter over `keys` that always returns a tuple (the operator returns a bare value for one)."""
    if not keys:
        return lambda row: ()
    one = get(*keys)
    return one if len(keys) > 1 else (lambda row: (one(row),))


@dataclass
class Rows:
    """Accepted rows of one request (or of a micro-batch): each row's numbers and texts in schema order."""

    numbers: list[tuple]
    texts: list[tuple]

    def __len__(self) -> int:
        return len(self.numbers)

    def extend(self, other: Rows) -> None:
        self.numbers += other.numbers
        self.texts += other.texts


class RowDecoder:
    """Body bytes -> accepted `Rows`, or BodyRefused / RowsRefused; and `Rows` -> the feed of a raw-input
    graph (tasks/modalities/table/graph.py): one 1-D array per feature, double for numbers (null = NaN), text for
    categories (null = "", an int as its digits), as tasks.modalities.table.encoding.raw_columns makes them."""

    inline_body_bytes = 64 << 10   # the largest body decoded on the event loop (~40 rows of 64 columns: microseconds)

    def __init__(self, schema: Schema):
        self.schema = schema
        self.row_type = row_model(schema)
        numeric = [i for i, f in enumerate(schema.features) if f.kind == "numeric"]
        text = [i for i, f in enumerate(schema.features) if f.kind != "numeric"]
        self.number_names = [schema.features[i].name for i in numeric]
        self.text_names = [schema.features[i].name for i in text]
        split = numeric + text   # a row's values as Rows keeps them: numbers, then texts
        self._order = [split.index(i) for i in range(len(split))]
        fields = [(f"f{i}", _fast_type(f), msgspec.field(name=f.name)) for i, f in enumerate(schema.features)]
        row = msgspec.defstruct("Row", fields, forbid_unknown_fields=True)
        body = msgspec.defstruct("Body", [("rows", Annotated[list[row], msgspec.Meta(min_length=1)])])
        self._decoder = msgspec.json.Decoder(body)
        self._struct_numbers = _getter(operator.attrgetter, [f"f{i}" for i in numeric])
        self._struct_texts = _getter(operator.attrgetter, [f"f{i}" for i in text])
        self._dict_numbers = _getter(operator.itemgetter, self.number_names)
        self._dict_texts = _getter(operator.itemgetter, self.text_names)

    def decode(self, body: bytes, content_type: str | None = None) -> Rows:
        """The request's rows, parsed and checked in one pass; anything that pass refuses is judged again by
        `row_model` (every problem named), and served if that accepts it. (`content_type`: rows come as JSON
        whatever the header says; an image model's decoder reads uploads by it.)"""
        try:
            rows = self._decoder.decode(body).rows
        except msgspec.MsgspecError:
            return self._decode_slowly(body)
        return Rows([self._struct_numbers(r) for r in rows], [self._struct_texts(r) for r in rows])

    def _decode_slowly(self, body: bytes) -> Rows:
        try:
            parsed = json.loads(body)   # Python's parser: NaN and Infinity parse, so the row check can name them
        except (ValueError, UnicodeDecodeError) as exc:
            raise BodyRefused(400, f"body is not valid JSON: {exc}") from None
        rows = parsed.get("rows") if isinstance(parsed, dict) else None
        if not isinstance(rows, list) or not rows:
            raise BodyRefused(422, ROWS_SHAPE)
        problems = validate_rows(self.row_type, rows)
        if problems:
            raise RowsRefused(problems)
        return Rows([self._dict_numbers(r) for r in rows], [self._dict_texts(r) for r in rows])

    def feed(self, rows: Rows) -> dict[str, np.ndarray]:
        """The graph's inputs for these rows (columns are contiguous 1-D arrays)."""
        feed: dict[str, np.ndarray] = {}
        if self.number_names:
            matrix = np.array(rows.numbers, dtype=np.float64)   # (N, numeric features); None -> NaN
            feed.update(zip(self.number_names, np.ascontiguousarray(matrix.T)))
        for name, column in zip(self.text_names, zip(*rows.texts)):
            feed[name] = np.array(["" if v is None else str(v) for v in column], dtype=object)
        return feed

    def features(self, rows: Rows, index: int) -> dict:
        """Row `index` as {column: value} in schema order (the request log's `features`)."""
        values = rows.numbers[index] + rows.texts[index]
        return dict(zip(self.schema.feature_names, [values[k] for k in self._order]))

    def inputs(self) -> set[str]:
        """The served graph's inputs the feed names: one per feature column."""
        return set(self.schema.feature_names)

    def blank(self) -> Rows:
        """One row of nulls (the warm-up)."""
        return Rows([(None,) * len(self.number_names)], [(None,) * len(self.text_names)])

    def bare_inputs(self, rows: Rows) -> np.ndarray:
        """The encoded matrix a bare model takes (a version registered before its graph took raw rows)."""
        import pandas as pd

        from tasks.modalities.table.encoding import encode_features

        return encode_features(pd.DataFrame([self.features(rows, i) for i in range(len(rows))]), self.schema)


class TableServing:
    """What the service takes of the table modality: its request decoding, its OpenAPI request, its batch scoring."""

    def decoder(self, schema: Schema, host=None) -> RowDecoder:
        """Rows by the model's own schema (a table needs nothing of the serving host's params)."""
        return RowDecoder(schema)

    def document(self, variant) -> dict:
        """/predict's request for this version: a row's pydantic schema (what words the 422s), its nested models to
        put under components, and the wording of the answers that differ by modality."""
        row = variant.decoder.row_type.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        row["title"] = "PredictRow"
        components = row.pop("$defs", {})
        return {"description": f"Scores raw rows ({len(variant.schema.features)} columns, from the serving model's "
                               f"contract); {ROWS_SHAPE}.",
                "content": {"application/json": {"schema": {
                    "type": "object", "title": "PredictRequest", "required": ["rows"],
                    "properties": {"rows": {"type": "array", "minItems": 1, "items": row}}}}},
                "components": components, "items": "row",
                "too_large": "the body is over serve.max_body_mb",
                "refused": "rows that break the contract: one problem per (row, field)"}

    def predict(self, source, output, variant, params, chunk: int, show_progress: bool = True):
        """`torchship predict`: a CSV or Parquet file scored chunk by chunk (tasks/modalities/table/batch.py)."""
        from pathlib import Path

        from tasks.core.errors import DataError
        from tasks.modalities.table.batch import predict_file

        if Path(source).is_dir():
            raise DataError(f"{source} is a folder, and v{variant.version} scores rows of a table: give a .csv or "
                            ".parquet file")
        return predict_file(source, output, variant, chunk, show_progress)


SERVING = TableServing()
