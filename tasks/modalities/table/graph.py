"""The raw-row front of a served model: one typed input per feature column, category text -> code inside
the graph, softmax at the end, then the served label (argmax, or a binary model's decision threshold). The
composed file scores the rows a user has with ONNX Runtime alone, so
`mlflow models serve` of a registered version takes raw JSON rows.

Inputs, each 1-D [N] and named exactly as the column (MLflow's ONNX flavor feeds `frame[name].values`):
numeric -> double (NaN = missing; cast to float32 as `encode_features` does), categorical -> string
(`tasks.modalities.table.encoding.normalise_category`, then `category_lookup`; unknown or blank -> UNKNOWN_CODE).
"""
from __future__ import annotations

import re

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper

from tasks.core.graph_nodes import INNER, MODEL, GraphNodes, assemble, at_opset
from tasks.core.runtime import DECISION, RAW_INPUTS, THRESHOLD_KEY, decision_threshold
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.table.encoding import category_lookup

ML_OPSET = 3    # ai.onnx.ml LabelEncoder (keys_strings -> values_int64s)
# Every character Python's str.split() splits on (tests keep it in step with str.isspace).
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
OUTPUTS = ("logits", "probabilities", DECISION)


def _char_class(chars: str) -> str:
    """An RE2 character class of exactly these code points."""
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in chars) + "]"


def _split_codes(name: str, lookup: dict[str, int], tag: str) -> onnx.GraphProto:
    """Codes when the batch's only whitespace is spaces: StringSplit drops space runs and empty tokens; the
    first `width` tokens are rejoined (padded with empty ones, so both sides pad alike) and looked up."""
    b = GraphNodes(tag)
    width = max((len(key.split(" ")) for key in lookup), default=1)
    tokens, count = b.op("StringSplit", name, outputs=2)
    pad = b.op("Expand", b.const("", TensorProto.STRING), b.op("Concat", b.op("Shape", name),
                                                                 b.const([width], TensorProto.INT64), axis=0))
    padded = b.op("Concat", tokens, pad, axis=1)   # (N, tokens + width): Gather below never runs past it
    joined = b.op("Gather", padded, b.const(0, TensorProto.INT64), axis=1)
    for i in range(1, width):
        spaced = b.op("StringConcat", joined, b.const(" ", TensorProto.STRING))
        joined = b.op("StringConcat", spaced, b.op("Gather", padded, b.const(i, TensorProto.INT64), axis=1))
    keys = [" ".join(key.split(" ") + [""] * (width - len(key.split(" ")))) for key in lookup] or [" "]
    codes = b.op("LabelEncoder", joined, domain="ai.onnx.ml", keys_strings=keys,
                 values_int64s=list(lookup.values()) or [0], default_int64=0)
    too_long = b.op("Greater", count, b.const(width, TensorProto.INT64))   # more tokens than any category
    return b.graph(b.op("Where", too_long, b.const(0, TensorProto.INT64), codes))


def _regex_codes(name: str, lookup: dict[str, int], tag: str) -> onnx.GraphProto:
    """Codes for any whitespace: one full match per category, tokens separated by whitespace runs."""
    b = GraphNodes(tag)
    space = _char_class(WHITESPACE)
    codes = b.op("Expand", b.const(0, TensorProto.INT64), b.op("Shape", name))
    for key, code in lookup.items():
        pattern = f"{space}*" + f"{space}+".join(re.escape(token) for token in key.split(" ")) + f"{space}*"
        codes = b.op("Where", b.op("RegexFullMatch", name, pattern=pattern), b.const(code, TensorProto.INT64), codes)
    return b.graph(codes)


def _category_codes(b: GraphNodes, feature: Feature, index: int) -> str:
    """Category text -> float code; the regex branch runs only for a batch holding whitespace other than
    spaces (tabs, newlines, no-break spaces), which StringSplit in ONNX Runtime does not split on."""
    lookup = category_lookup(feature)
    other = b.op("RegexFullMatch", feature.name, pattern="(?s).*" + _char_class(WHITESPACE.replace(" ", "")) + ".*")
    found = b.op("ReduceSum", b.op("Cast", other, to=TensorProto.INT64), keepdims=0)
    codes = b.op("If", b.op("Greater", found, b.const(0, TensorProto.INT64)),
                 then_branch=_regex_codes(feature.name, lookup, f"raw/{index}/regex"),
                 else_branch=_split_codes(feature.name, lookup, f"raw/{index}/split"))
    return b.op("Cast", codes, to=TensorProto.FLOAT)


def compose_raw_model(model: onnx.ModelProto, schema: Schema) -> onnx.ModelProto:
    """The model (input `x` float32 (N, F), output `logits`) behind per-column raw inputs; outputs `logits`,
    `probabilities` (N, C) and `decision` (N, C, one-hot: the threshold the model's metadata carries applied).
    Metadata is kept, plus `torchship.inputs=raw`."""
    if [i.name for i in model.graph.input] != ["x"] or "logits" not in [o.name for o in model.graph.output]:
        raise ValueError("the model to compose must take one input `x` and give an output `logits`")
    clashes = [f.name for f in schema.features if f.name in OUTPUTS or f.name.startswith(INNER) or not f.name]
    if clashes:
        raise ValueError(f"feature name(s) {clashes} cannot name a graph input: they are empty, an output name "
                         f"{OUTPUTS} or start with {INNER!r}; rename the column(s)")
    metadata = {p.key: p.value for p in model.metadata_props}
    threshold = decision_threshold(metadata)
    if threshold is not None and len(schema.classes) != 2:
        raise ValueError(f"{THRESHOLD_KEY} {threshold} is a binary model's rule, and this model has "
                         f"{len(schema.classes)} classes")
    inner = onnx.compose.add_prefix(at_opset(model), MODEL)
    b = GraphNodes("raw")
    columns, inputs = [], []
    for index, feature in enumerate(schema.features):
        numeric = feature.kind == "numeric"
        inputs.append(helper.make_tensor_value_info(feature.name, TensorProto.DOUBLE if numeric else TensorProto.STRING,
                                                    ["batch"]))
        value = b.op("Cast", feature.name, to=TensorProto.FLOAT) if numeric else _category_codes(b, feature, index)
        columns.append(b.op("Unsqueeze", value, b.const([1], TensorProto.INT64)))
    b.nodes.append(helper.make_node("Concat", columns, [f"{MODEL}x"], axis=1))   # x: (N, F) float32
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if name == DECISION else TensorProto.FLOAT,
                                             ["batch", len(schema.classes)]) for name in OUTPUTS]
    return assemble(inner, b.nodes, inputs, outputs, threshold, len(schema.classes), {**metadata, **RAW_INPUTS},
                    "torchship-raw", {"ai.onnx.ml": ML_OPSET})


def client_rows(frame: pd.DataFrame, schema: Schema) -> pd.DataFrame:
    """The feature columns as a client sends them: plain Python values, missing = None (object columns, which
    MLflow's pyfunc feeds to ONNX Runtime as they are: a pandas "string" column is refused there)."""
    features = frame[schema.feature_names]
    return features.astype(object).where(features.notna(), None)


def raw_signature(schema: Schema):
    """The MLflow signature of a composed graph: a double or string column per feature in, the graph's
    outputs (N, C) out (the decision one-hot int64) (MLflow's pyfunc flattens each to N*C values, row-major)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, TensorSpec
    from mlflow.types import Schema as Columns

    columns = [ColSpec("double" if f.kind == "numeric" else "string", f.name) for f in schema.features]
    outputs = [TensorSpec(np.dtype(np.int64 if name == DECISION else np.float32), (-1, len(schema.classes)), name)
               for name in OUTPUTS]
    return ModelSignature(inputs=Columns(columns), outputs=Columns(outputs))
