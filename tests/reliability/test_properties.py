"""Properties over generated input (hypothesis, bounded examples, no deadline on a shared box):
- the contract parser: a `contract:` section it accepts survives a YAML round trip unchanged; one it refuses
  raises ConfigError (one paragraph naming the key), never a traceback of another kind;
- the encoding: rows the service accepts are coded by the raw ONNX graph exactly as the Python encoding
  (tasks.modalities.table.encoding) codes them (whitespace, blanks, missing values, numbers at float32's edge);
- the row decoder: any JSON body (or bytes) is a 200 path or a 400/422 refusal, never another exception; a
  number beyond float32 is refused naming the field and the rule."""
from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.config import parse_params, read_params_file
from tasks.core.errors import ConfigError
from tasks.core.refusals import BodyRefused, RowsRefused
from tasks.core.schema_spec import Feature, Schema
from tasks.core.servelog import served_bytes
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.graph import WHITESPACE
from tasks.modalities.table.serving import FLOAT32_MAX, FLOAT32_RULE, RowDecoder

pytestmark = pytest.mark.reliability
BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

# ---- the contract parser -------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=8)
junk = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner,
                                                                                          max_size=3)), max_leaves=8)
numbers = st.one_of(st.none(), st.floats(), st.integers(-10**6, 10**6),
                    st.sampled_from([math.nan, math.inf, -math.inf]))
rules = st.fixed_dictionaries({"type": st.sampled_from(["numeric", "numeric", "categorical", "text"])}, optional={
    "nullable": st.one_of(st.booleans(), st.sampled_from(["yes", 2])),
    "max_null_share": st.one_of(st.floats(-1, 2), st.none()),
    "min": numbers, "max": numbers,
    "categories": st.one_of(st.none(), st.lists(st.text(max_size=6), max_size=4), st.just("abc")),
    "on_violation": st.sampled_from(["fail", "warn", "ignore"]),
})
plausible_rules = st.one_of(   # mostly valid: so that accepted contracts are common enough to judge
    st.builds(lambda low, high: {"type": "numeric", "min": low, "max": high}, numbers, numbers),
    st.builds(lambda names: {"type": "categorical", "categories": names}, st.lists(st.text(max_size=6), max_size=4)))
odd_rules = st.one_of(rules, st.just({"type": "numeric", "colour": "red"}), junk)   # an unknown key, not a rule
contracts = st.fixed_dictionaries(
    {"target": names, "classes": st.lists(st.text(max_size=5), min_size=2, max_size=3),
     "columns": st.dictionaries(names, st.one_of(plausible_rules, plausible_rules, rules, odd_rules), min_size=1,
                                max_size=4)},
    optional={"min_class_share": st.floats(-0.5, 1.5), "min_rows": st.integers(-2, 100),
              "max_rows": st.one_of(st.none(), st.integers(-5, 10**6))})


def yaml_text(document) -> str:
    from ruamel.yaml import YAML

    stream = io.StringIO()
    YAML(typ="safe").dump(document, stream)
    return stream.getvalue()


@BOUNDED
@given(contract=st.one_of(contracts, junk))
def test_a_contract_is_accepted_and_round_trips_or_refused_with_a_config_error(contract, tmp_path_factory):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml_text({"contract": contract}))
    try:
        parsed = parse_params(read_params_file(path), origin=str(path))
    except ConfigError as exc:
        assert str(path) in str(exc) and "contract" in str(exc)
        return
    if parsed.contract is None:
        return
    for rule in parsed.contract.columns.values():   # what is accepted can be judged against
        assert all(v is None or math.isfinite(v) for v in (rule.min, rule.max)), rule
        assert rule.min is None or rule.max is None or rule.min <= rule.max, rule
    again = tmp_path_factory.mktemp("params") / "params.yaml"
    again.write_text(yaml_text({"contract": parsed.contract.model_dump(mode="json")}))
    assert parse_params(read_params_file(again)).contract == parsed.contract


@BOUNDED
@given(text=st.text(max_size=60))
def test_any_params_text_is_params_or_a_config_error(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(text)
    try:
        parse_params(read_params_file(path), origin=str(path))
    except ConfigError:
        pass


# ---- the encoding: the raw graph codes rows as the Python encoding does ----------------------------------------

CATEGORIES = ["bank transfer", "card", "c++ (gold)", "café", "日本 語"]
SCHEMA = Schema(source="t", target="y", classes=["a", "b", "c", "d"], features=[
    Feature(name="age", kind="numeric"),
    Feature(name="pay method", kind="categorical", categories=CATEGORIES),
    Feature(name="plan", kind="categorical", categories=["basic", "premium"], closed_categories=True),
    Feature(name="amount", kind="numeric", min=-5.0, max=1e6, nullable=False),
])
spaces = st.text(alphabet=WHITESPACE, max_size=3)
words = st.one_of(st.sampled_from([*CATEGORIES, "bank", "transfer", "Card", "", "None"]), st.text(max_size=6))
padded = st.builds(lambda a, w, b, v, c: f"{a}{w}{b}{v}{c}", spaces, words, spaces, words, spaces)
row = st.fixed_dictionaries({
    "age": st.one_of(st.none(), st.floats(-FLOAT32_MAX, FLOAT32_MAX), st.integers(-10**9, 10**9)),
    "pay method": st.one_of(st.none(), padded, st.integers(-99, 99)),
    "plan": st.one_of(st.none(), st.builds(lambda a, w, b: f"{a}{w}{b}", spaces, st.sampled_from(["basic", "premium"]),
                                           spaces)),
    "amount": st.floats(-5.0, 1e6)})
DECODER = RowDecoder(SCHEMA)


@pytest.fixture(scope="module")
def coding_graph():
    """The raw-input graph in front of an identity model: its logits are the codes it gives each row."""
    from tasks.core.runtime import open_onnx
    from tasks.modalities.table.graph import compose_raw_model
    from tests.model.test_raw_onnx import identity_graph

    return open_onnx(compose_raw_model(identity_graph(SCHEMA), SCHEMA).SerializeToString(), 1)


@BOUNDED
@given(rows=st.lists(row, min_size=1, max_size=6))
def test_the_served_graph_codes_accepted_rows_as_the_python_encoding_does(rows, coding_graph):
    accepted = DECODER.decode(json.dumps({"rows": rows}).encode())
    served = coding_graph.run(["logits"], DECODER.feed(accepted))[0]
    python = encode_features(pd.DataFrame(rows, columns=SCHEMA.feature_names), SCHEMA)
    np.testing.assert_array_equal(served, python)   # NaN (a missing number, imputed by the model) equals NaN here
    assert not np.isinf(served).any(), "an accepted number became infinite inside the model"


# ---- the row decoder: any body is served or refused, never a 5xx path ---------------------------------------------

values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                   st.sampled_from(["basic", " premium ", "card"]), st.lists(st.integers(), max_size=2))
near_rows = st.dictionaries(st.sampled_from([*SCHEMA.feature_names, "extra"]), values, max_size=5)
bodies = st.one_of(
    junk.map(lambda v: json.dumps(v).encode()),
    st.lists(st.one_of(near_rows, row, junk), max_size=4).map(lambda rs: json.dumps({"rows": rs}).encode()),
    st.binary(max_size=40),
    st.lists(row, min_size=1, max_size=2).map(lambda rs: json.dumps({"rows": rs}).encode()[:-3]))   # cut short


@BOUNDED
@given(body=bodies)
def test_any_body_is_served_or_refused_with_a_reason(body, coding_graph):
    try:
        accepted = DECODER.decode(body)
    except BodyRefused as exc:
        assert exc.status in (400, 422) and exc.detail
        return
    except RowsRefused as exc:
        assert exc.problems and all({"row", "field", "rule", "message"} <= set(p) for p in exc.problems)
        return
    probabilities = coding_graph.run(["probabilities"], DECODER.feed(accepted))[0]
    assert probabilities.shape == (len(accepted), len(SCHEMA.classes))
    for index in range(len(accepted)):   # and each served row can be written to the request log
        served_bytes("r", index, "champion", "1", DECODER.features(accepted, index), "a", {"a": 1.0}, ts=0)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64, 10**30])
def test_an_integer_category_beyond_64_bits_is_refused_not_a_failed_log_line(value):
    body = f'{{"rows": [{{"age": 1, "pay method": {value}, "plan": "basic", "amount": 1}}]}}'.encode()
    with pytest.raises(RowsRefused) as refused:
        DECODER.decode(body)
    [problem] = refused.value.problems
    assert (problem["field"], problem["rule"]) == ("pay method",
                                                   "less_than_equal" if value > 0 else "greater_than_equal")


@pytest.mark.parametrize("value", ["1e40", "-1e39", "3.5e38", "1.7976931348623157e308"])
def test_a_number_beyond_float32_is_refused_naming_the_field_and_the_rule(value):
    body = f'{{"rows": [{{"age": {value}, "pay method": "card", "plan": "basic", "amount": 1}}]}}'.encode()
    with pytest.raises(RowsRefused) as refused:
        DECODER.decode(body)
    [problem] = refused.value.problems
    assert (problem["row"], problem["field"], problem["rule"]) == (0, "age", FLOAT32_RULE)
    assert "float32" in problem["message"]


def test_the_largest_float32_is_served():
    body = json.dumps({"rows": [{"age": FLOAT32_MAX, "pay method": "card", "plan": "basic", "amount": 1}]}).encode()
    assert len(DECODER.decode(body)) == 1
