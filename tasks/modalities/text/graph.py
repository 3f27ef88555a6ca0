"""The served text graph: raw strings in; the run's tokenizer as stock ONNX Runtime operators (no extensions
library), then the model; logits, probabilities, the served label (one-hot `decision`) and a small fixed random
projection of the model's own embedding out. ONNX Runtime, `mlflow models serve`, `mlflow.pyfunc` and torchship's
service feed the same strings and answer the same probabilities.

The front end, per text (tasks/modalities/text/tokenizer.py states the rule it must equal):
`StringNormalizer` LOWER in the C.UTF-8
locale (per code point `towlower`; the default en_US.UTF-8 fails to load where that locale is not installed) ->
`com.microsoft.Tokenizer` with the tokenizer's RE2 token expression ([N, K] tokens, padded with "", K the batch's
most; K = 0 when no text has a token) -> the first max_tokens columns -> `ai.onnx.ml.LabelEncoder` (vocabulary ->
ids, "" -> 0, anything else -> 1) -> padded with zeros to [N, max_tokens] int64."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, compose, helper

from tasks.core.graph_nodes import MODEL, OPSET, GraphNodes, assemble, at_opset
from tasks.core.runtime import DECISION, EMBEDDING, RAW_INPUTS, decision_threshold
from tasks.core.schema_spec import Schema
from tasks.modalities.text.tokenizer import FIRST_WORD, PAD, UNKNOWN, Tokenizer

TEXT_INPUT = "text"   # the served graph's one input: strings [N]
IDS = "ids"           # the standalone front end's output: (N, max_tokens) int64
PROJECTED = 16
OUTPUTS = ("logits", "probabilities", DECISION, EMBEDDING)
TOKENIZER_KEY = "torchship.tokenizer_sha256"   # metadata: which tokenizer artifact the graph holds
LOCALE = "C.UTF-8"
PAD_TOKEN = ""        # what the Tokenizer pads rows with: never a token (a token has at least one character)
OPSETS = {"ai.onnx.ml": 3, "com.microsoft": 1}   # LabelEncoder keys_strings -> values_int64s; Tokenizer


def lowered(b: GraphNodes, text: str) -> str:
    """The strings lower-cased one code point at a time (ONNX Runtime: `towlower` of the LOCALE)."""
    return b.op("StringNormalizer", text, case_change_action="LOWER", is_case_sensitive=1, locale=LOCALE)


def front_nodes(b: GraphNodes, tokenizer: Tokenizer, text: str, ids: str) -> None:
    """Nodes from the string tensor `text` [N] to `ids` (N, max_tokens) int64 (module docstring)."""
    cased = lowered(b, text) if tokenizer.lowercase else text
    tokens = b.op("Tokenizer", cased, domain="com.microsoft", mark=0, mincharnum=1, pad_value=PAD_TOKEN,
                  tokenexp=tokenizer.re2_expression())                               # (N, K) strings
    width = b.const([tokenizer.max_tokens], TensorProto.INT64)
    start, axis = b.const([0], TensorProto.INT64), b.const([1], TensorProto.INT64)
    kept = b.op("Slice", tokens, start, width, axis)                                 # (N, min(K, T))
    found = b.op("LabelEncoder", kept, domain="ai.onnx.ml", keys_strings=[PAD_TOKEN, *tokenizer.vocabulary],
                 values_int64s=[PAD, *range(FIRST_WORD, tokenizer.vocab_size)], default_int64=UNKNOWN)
    rows = b.op("Shape", text)
    zeros = b.op("ConstantOfShape", b.op("Concat", rows, width, axis=0),
                 value=helper.make_tensor("value", TensorProto.INT64, [1], [PAD]))   # (N, T)
    padded = b.op("Concat", found, zeros, axis=1)                                    # (N, min(K, T) + T)
    b.nodes.append(helper.make_node("Slice", [padded, start, width, axis], [ids]))


def text_feed(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """The graph's feed for these texts: a 1-D object array. Never `np.array(texts)`: its fixed-width unicode
    strings reach ONNX Runtime cut at the first NUL character ("a\x00b" is read as "a")."""
    column = np.empty(len(texts), dtype=object)
    column[:] = list(texts)
    return {TEXT_INPUT: column}


def opset_imports(extra: dict[str, int]) -> list:
    """The default domain at OPSET plus `extra` domains at their versions."""
    return [helper.make_opsetid("", OPSET), *(helper.make_opsetid(domain, v) for domain, v in extra.items())]


def tokenizer_graph(tokenizer: Tokenizer) -> onnx.ModelProto:
    """The front end alone: `text` strings [N] -> `ids` (N, max_tokens) int64, checked."""
    b = GraphNodes("text")
    front_nodes(b, tokenizer, TEXT_INPUT, IDS)
    graph = helper.make_graph(b.nodes, "torchship-text-front", [text_input()],
                              [helper.make_tensor_value_info(IDS, TensorProto.INT64, ["batch", tokenizer.max_tokens])])
    model = helper.make_model(graph, opset_imports=opset_imports(OPSETS))
    helper.set_model_props(model, {TOKENIZER_KEY: tokenizer.sha256})
    onnx.checker.check_model(model)
    return model


def text_input():
    """The graph input: strings [N]."""
    return helper.make_tensor_value_info(TEXT_INPUT, TensorProto.STRING, ["batch"])


def compose_text_model(bare: onnx.ModelProto, schema: Schema, tokenizer: Tokenizer) -> onnx.ModelProto:
    """The bare exported model (input `x` int64 (N, T), outputs `logits` and `embedding`) behind the input `text`
    and the tokenizer's front end, with `probabilities` (softmax), `decision` (the served label, one-hot) and
    `embedding`; metadata kept, plus `torchship.inputs=raw` and the tokenizer's sha256."""
    outputs = {o.name for o in bare.graph.output}
    if [i.name for i in bare.graph.input] != ["x"] or not {"logits", EMBEDDING} <= outputs:
        raise ValueError("the text model to compose must take one input `x` and give `logits` and `embedding`")
    dims = bare.graph.input[0].type.tensor_type.shape.dim
    tokens = dims[-1].dim_value if dims else 0
    if tokens and tokens != tokenizer.max_tokens:
        raise ValueError(f"the model takes {tokens} token ids per text, the tokenizer gives {tokenizer.max_tokens}")
    metadata = {p.key: p.value for p in bare.metadata_props}
    b = GraphNodes("text")
    front_nodes(b, tokenizer, TEXT_INPUT, f"{MODEL}x")
    projected = next(o for o in bare.graph.output if o.name == EMBEDDING).type.tensor_type.shape.dim[-1].dim_value
    n_classes = len(schema.classes)
    widths = {"logits": n_classes, "probabilities": n_classes, DECISION: n_classes, EMBEDDING: projected or None}
    declared = [helper.make_tensor_value_info(name, TensorProto.INT64 if name == DECISION else TensorProto.FLOAT,
                                              ["batch", widths[name]]) for name in OUTPUTS]
    return assemble(compose.add_prefix(at_opset(bare), MODEL), b.nodes, [text_input()], declared,
                    decision_threshold(metadata), n_classes,
                    {**metadata, **RAW_INPUTS, TOKENIZER_KEY: tokenizer.sha256}, "torchship-text", OPSETS,
                    passed=(EMBEDDING,))


def projected_width(path) -> int:
    """The width of a served text graph's `embedding` output (PROJECTED, or the model's own when narrower)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    dims = next(o for o in graph.output if o.name == EMBEDDING).type.tensor_type.shape.dim
    return dims[-1].dim_value or PROJECTED


def text_signature(schema: Schema, projected: int):
    """The MLflow signature of a composed text graph: the string tensor `text` (-1,) in; logits, probabilities and
    the decision (N, C) and the embedding projection (N, k) out. A tensor input, not a column: MLflow then feeds a
    frame's `text` column (and a JSON request's `inputs`, `dataframe_split` or `dataframe_records`) to the graph as
    [N] strings (a one-column schema would feed the frame's (N, 1) values, which a [N] input refuses), and returns
    each output unflattened. Of dtype object, not str: MLflow would otherwise convert to fixed-width unicode, which
    ONNX Runtime cuts at the first NUL character (see `text_feed`)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema as Columns
    from mlflow.types import TensorSpec

    classes = len(schema.classes)
    outputs = [TensorSpec(np.dtype(np.int64 if name == DECISION else np.float32),
                          (-1, projected if name == EMBEDDING else classes), name) for name in OUTPUTS]
    return ModelSignature(inputs=Columns([TensorSpec(np.dtype(object), (-1,), TEXT_INPUT)]), outputs=Columns(outputs))
