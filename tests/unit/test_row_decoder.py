"""tasks/modalities/table/serving.py: the one-pass decoder never accepts a row the contract's pydantic model refuses,
and
judges every body as that model does (the same 422 rows, fields and rules); its feed is the one
tasks.modalities.table.encoding.raw_columns builds (the reference the graph was gated on)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from tasks.core.refusals import BodyRefused, RowsRefused, validate_rows
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.table.encoding import raw_columns
from tasks.modalities.table.serving import RowDecoder

SCHEMA = Schema(source="t", target="y", classes=["no", "yes"], features=[
    Feature(name="customer age", kind="numeric", min=18, max=90, nullable=True),
    Feature(name="tenure", kind="numeric", nullable=False),
    Feature(name="plan", kind="categorical", categories=["basic", "premium", "bank  transfer"], closed_categories=True,
            nullable=False),
    Feature(name="region", kind="categorical", categories=["north", "south"]),
])
GOOD = {"customer age": 40, "tenure": 3.5, "plan": "basic", "region": "north"}
# Values that probe every rule of each kind of column: JSON text, spliced into a row as is.
PROBES = {
    "customer age": ["40", "18", "90", "17.999", "90.0001", "-0.0", "null", "true", "\"40\"", "NaN", "Infinity",
                     "-Infinity", "1e999", "123456789012345678901234567890", "[40]", "{}"],
    "tenure": ["0", "-1e300", "1e308", "null", "false", "\"3\"", "NaN", "1e999", "-1e999"],
    "plan": ["\"basic\"", "\" basic \"", "\"bank transfer\"", "\"bank  transfer\"", "\"Basic\"", "\"gold\"", "\"\"",
             "null", "1", "true", "1.5"],
    "region": ["\"north\"", "\"atlantis\"", "\"\"", "null", "3", "-7", "true", "2.5", "[]"],
}


def body_with(column: str, value: str) -> bytes:
    row = json.dumps({k: v for k, v in GOOD.items() if k != column})[:-1]
    return f'{{"rows": [{row}, "{column}": {value}}}]}}'.encode()


def pydantic_verdict(decoder: RowDecoder, body: bytes) -> list[dict]:
    """What the contract's pydantic model alone says of a body Python's json parses."""
    return validate_rows(decoder.row_type, json.loads(body)["rows"])


@pytest.mark.parametrize("column,value", [(c, v) for c, values in PROBES.items() for v in values])
def test_the_fast_pass_accepts_nothing_the_contract_refuses_and_the_verdict_is_the_contracts(column, value):
    decoder = RowDecoder(SCHEMA)
    body = body_with(column, value)
    expected = pydantic_verdict(decoder, body)
    try:
        fast = decoder._decoder.decode(body)
    except Exception:
        fast = None
    if fast is not None:
        assert expected == [], f"the fast pass accepted {column}={value}, which the contract refuses: {expected}"
    if expected:
        with pytest.raises(RowsRefused) as refused:
            decoder.decode(body)
        assert refused.value.problems == expected
    else:
        assert len(decoder.decode(body)) == 1


def test_a_missing_and_an_extra_column_are_named_with_their_rule():
    decoder = RowDecoder(SCHEMA)
    rows = [GOOD, {**{k: v for k, v in GOOD.items() if k != "tenure"}, "colour": "red"}]
    with pytest.raises(RowsRefused) as refused:
        decoder.decode(json.dumps({"rows": rows}).encode())
    assert {(p["row"], p["field"], p["rule"]) for p in refused.value.problems} == {
        (1, "tenure", "missing"), (1, "colour", "extra_forbidden")}


@pytest.mark.parametrize("body,status", [(b'{"rows": [', 400), (b"\xff\xfe", 400), (b"", 400), (b"[1]", 422),
                                         (b'{"rows": []}', 422), (b'{"rows": {"tenure": 1}}', 422), (b"null", 422)])
def test_a_body_that_is_no_request_is_refused_with_its_status(body, status):
    with pytest.raises(BodyRefused) as refused:
        RowDecoder(SCHEMA).decode(body)
    assert refused.value.status == status and refused.value.detail


def test_other_top_level_keys_are_ignored():
    assert len(RowDecoder(SCHEMA).decode(json.dumps({"rows": [GOOD], "trace": "x"}).encode())) == 1


def test_the_feed_is_what_raw_columns_builds_for_every_accepted_row():
    decoder = RowDecoder(SCHEMA)
    rows = [dict(zip(GOOD, combo)) for combo in itertools.product([18, 44.5, None], [0, -3.25, 3e38],
                                                                  ["basic", " premium\t", "bank  transfer"],
                                                                  ["north", None, 7, " south ", "unseen"])]
    feed = decoder.feed(decoder.decode(json.dumps({"rows": rows}).encode()))
    reference = raw_columns(pd.DataFrame(rows), SCHEMA)
    assert set(feed) == set(reference)
    for name, column in reference.items():
        assert feed[name].dtype == column.dtype and feed[name].flags.c_contiguous, name
        if column.dtype == np.float64:
            np.testing.assert_array_equal(feed[name], column)
        else:
            assert feed[name].tolist() == column.tolist(), name


def test_features_are_the_row_in_schema_order():
    decoder = RowDecoder(SCHEMA)
    row = {"region": None, "plan": "basic", "tenure": 2, "customer age": None}
    assert list(decoder.features(decoder.decode(json.dumps({"rows": [row]}).encode()), 0).items()) == [
        ("customer age", None), ("tenure", 2.0), ("plan", "basic"), ("region", None)]
