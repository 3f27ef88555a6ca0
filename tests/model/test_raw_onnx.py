"""tasks/modalities/table/graph.py: the composed raw-input graph codes raw rows exactly as Python's
`encode_features` does (unknown, missing, blank, every kind of whitespace), and scores them as the bare model
does; the raw parity gate bites."""
from __future__ import annotations

import sys

import numpy as np
import onnx
import pandas as pd
import pytest
import torch
from onnx import TensorProto, helper

from models import build_model
from tasks.core.params_spec import ExportParams
from tasks.core.runtime import open_onnx, takes_raw_rows
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.scoring import predict_proba
from tasks.modalities.table.encoding import category_lookup, encode_features, normalise_category
from tasks.modalities.table.graph import WHITESPACE, client_rows, compose_raw_model
from tasks.modalities.table.probe import check_raw_parity, raw_probe_rows, spaces_only
from tasks.training.weights import model_spec
from tasks.variants.exporters import export_onnx
from tasks.variants.quantize import quantize_onnx

RULES = ExportParams(parity_atol=1e-5)
CATEGORIES = ["bank transfer", "card", "bank  transfer", "  ", "c++ (gold)", "50$ a.b*", "café", "日本 語", "None"]
SCHEMA = Schema(source="t", target="y", classes=["a", "b", "c", "d"], features=[
    Feature(name="age", kind="numeric"),
    Feature(name="pay method", kind="categorical", categories=CATEGORIES),
    Feature(name="plan", kind="categorical", categories=["basic"]),
    Feature(name="empty", kind="categorical", categories=[]),
])


def identity_graph(schema: Schema, opset: int = 17) -> onnx.ModelProto:
    """A stand-in model whose logits are its input x: the composed graph's logits are then its codes."""
    width = len(schema.features)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["logits"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    helper.set_model_props(model, {"torchship.schema": schema.model_dump_json(), "torchship.exporter": "test"})
    return model


def composed_session(model: onnx.ModelProto, schema: Schema):
    return open_onnx(compose_raw_model(model, schema).SerializeToString(), 1)


def graph_codes(session, rows: pd.DataFrame) -> np.ndarray:
    from tasks.modalities.table.encoding import raw_columns

    return session.run(["logits"], raw_columns(rows, SCHEMA))[0]


def edge_rows() -> pd.DataFrame:
    """Every whitespace character around and inside categories, unknowns, blanks, missing values of each
    kind, regex metacharacters, text that is longer than any category, numbers as text and far out."""
    texts = [f"{w}bank{w}{w}transfer{w}" for w in WHITESPACE] + [f"{w}card" for w in WHITESPACE] + [
        "card", "Card", "card card", "bank transfer card", "bank", "transfer", "", "   ", "\t\n", None, np.nan, pd.NA,
        "c++ (gold)", "c++  (gold) ", "c+ (gold)", "50$ a.b*", "50$ aXb*", "café", " 日本\u3000語 ", "日本語", "None",
        "nan", 3, "never seen"]
    ages = [30, "41.5", None, np.nan, "not a number", np.inf, -1e40, 1e40]
    return pd.DataFrame({"age": [ages[i % len(ages)] for i in range(len(texts))], "pay method": texts,
                         "plan": [[" basic", "basic\t", None, "BASIC"][i % 4] for i in range(len(texts))],
                         "empty": [[None, "x", " ", "\u00a0"][i % 4] for i in range(len(texts))]})


def test_whitespace_is_what_python_splits_on():
    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert len(WHITESPACE) == len(set(WHITESPACE))


def test_category_lookup_normalises_keys_first_wins_blank_never_matches():
    assert normalise_category(" bank \t\u00a0transfer\n") == "bank transfer"
    lookup = category_lookup(SCHEMA.features[1])
    assert lookup["bank transfer"] == 1 and "" not in lookup and lookup["None"] == 9
    assert list(lookup.values()) == [1, 2, 5, 6, 7, 8, 9]   # "bank  transfer" (3) is 1's twin, "  " (4) is blank


@pytest.mark.parametrize("opset", [17, 20])   # converted up to 20, or composed as is
def test_graph_codes_equal_python_codes_on_edge_rows(opset):
    session = composed_session(identity_graph(SCHEMA, opset), SCHEMA)
    rows = edge_rows()
    plain = rows[spaces_only(rows, SCHEMA)]
    assert 0 < len(plain) < len(rows)   # both of the graph's paths run below
    for batch in (rows, plain, *(rows.iloc[[i]] for i in range(len(rows)))):
        np.testing.assert_array_equal(graph_codes(session, batch), encode_features(batch, SCHEMA))


def test_codes_are_known_categories_from_one_and_zero_otherwise():
    session = composed_session(identity_graph(SCHEMA), SCHEMA)
    rows = pd.DataFrame({"age": [1.0] * 4, "pay method": ["\tbank  transfer ", "café", "cafe", None],
                         "plan": ["basic", " basic ", "", None], "empty": ["", None, "a", " "]})
    np.testing.assert_array_equal(graph_codes(session, rows)[:, 1:], [[1, 1, 0], [7, 1, 0], [0, 0, 0], [0, 0, 0]])


def test_composed_model_has_a_typed_input_per_column_and_keeps_its_metadata():
    composed = compose_raw_model(identity_graph(SCHEMA), SCHEMA)
    types = {i.name: i.type.tensor_type.elem_type for i in composed.graph.input}
    assert types == {"age": TensorProto.DOUBLE, "pay method": TensorProto.STRING, "plan": TensorProto.STRING,
                     "empty": TensorProto.STRING}
    assert all(len(i.type.tensor_type.shape.dim) == 1 for i in composed.graph.input)   # 1-D, as MLflow feeds
    assert [o.name for o in composed.graph.output] == ["logits", "probabilities", "decision"]
    metadata = {p.key: p.value for p in composed.metadata_props}
    assert metadata["torchship.inputs"] == "raw" and metadata["torchship.exporter"] == "test"
    assert Schema.model_validate_json(metadata["torchship.schema"]) == SCHEMA


def test_a_feature_named_like_an_output_is_refused():
    schema = SCHEMA.model_copy(update={"features": [Feature(name="probabilities", kind="numeric")]})
    with pytest.raises(ValueError, match="probabilities"):
        compose_raw_model(identity_graph(schema), schema)


@pytest.fixture(scope="module")
def exported(encoded, tiny_train, tmp_path_factory):
    """The customers model (untrained: its embeddings still tell every code apart) as bare ONNX files."""
    torch.manual_seed(0)
    spec = model_spec(tiny_train)
    model = build_model(spec["name"], encoded.layout, **spec["kwargs"]).eval()
    folder = tmp_path_factory.mktemp("raw")
    export_onnx(model, encoded.prepared.schema, "legacy", folder / "fp32.onnx")
    quantize_onnx(folder / "fp32.onnx", folder / "int8.onnx")
    return folder


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_composed_variant_passes_raw_parity_with_python_encoding(exported, encoded, variant):
    schema, path = encoded.prepared.schema, exported / f"{variant}.onnx"
    bare = open_onnx(path, 1)
    composed = composed_session(onnx.load(str(path)), schema)
    assert takes_raw_rows(composed) and not takes_raw_rows(bare)
    probe = raw_probe_rows(encoded.prepared.holdout, schema, 64)
    gate = check_raw_parity(variant, bare, composed, schema, probe, RULES)
    assert gate.status == "pass", gate.reasons
    np.testing.assert_allclose(predict_proba(composed, schema, probe), predict_proba(bare, schema, probe), atol=1e-6)


def test_raw_parity_fails_when_the_graph_codes_categories_differently(exported, encoded):
    schema = encoded.prepared.schema
    shuffled = schema.model_copy(deep=True)
    for feature in shuffled.features:
        feature.categories = feature.categories[::-1]
    composed = composed_session(onnx.load(str(exported / "fp32.onnx")), shuffled)
    probe = client_rows(encoded.prepared.holdout.head(64), schema)
    gate = check_raw_parity("shuffled", open_onnx(exported / "fp32.onnx", 1), composed, schema, probe, RULES)
    assert gate.status == "fail" and "raw probe rows differ" in gate.reasons[0]
