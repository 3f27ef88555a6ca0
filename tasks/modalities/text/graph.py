"""The served text graph: raw strings in; the run's tokenizer as stock ONNX Runtime operators (no extensions
library), then the model; logits, probabilities, the served label (one-hot `decision`) and a small fixed random
projection of the model's own embedding out. ONNX Runtime, `mlflow models serve`, `mlflow.pyfunc` and torchship's
service feed the same strings and answer the same probabilities.

The front end, per text (tasks/modalities/text/tokenizer.py states the rule it must equal):
`StringNormalizer` LOWER in the C.UTF-8
locale (per code point `towlower`; the default en_US.UTF-8 fails to load where that locale is not installed) ->
`com.microsoft.Tokenizer` with the tokenizer's RE2 token expression ([N, K] tokens, padded with "", K the batch's
most; K = 0 when no text has a token) -> the first max_tokens columns -> `ai.onnx.ml.LabelEncoder` (vocabulary ->
ids, "" -> 0, anything else -> 1) -> padded with zeros to [N, max_tokens] int64; then, when the tokenizer has
character n-grams (`gram_nodes`), their ids after the words: [N, width]."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, compose, helper

from tasks.core.graph_nodes import MODEL, OPSET, GraphNodes, assemble, at_opset
from tasks.core.runtime import DECISION, EMBEDDING, RAW_INPUTS, decision_threshold
from tasks.core.schema_spec import Schema
from tasks.modalities.text.grams import CharGrams
from tasks.modalities.text.tokenizer import FIRST_WORD, PAD, UNKNOWN, Tokenizer

TEXT_INPUT = "text"   # the served graph's one input: strings [N]
IDS = "ids"           # the standalone front end's output: (N, width) int64
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
    """Nodes from the string tensor `text` [N] to `ids` (N, width) int64 (module docstring)."""
    cased = lowered(b, text) if tokenizer.lowercase else text
    if tokenizer.grams:
        words, grams = f"{ids}/words", f"{ids}/grams"
        word_nodes(b, tokenizer, cased, words)
        gram_nodes(b, tokenizer.grams, cased, grams)
        b.nodes.append(helper.make_node("Concat", [words, grams], [ids], axis=1))
    else:
        word_nodes(b, tokenizer, cased, ids)


def word_nodes(b: GraphNodes, tokenizer: Tokenizer, cased: str, ids: str) -> None:
    """The lower-cased strings [N] -> the word ids (N, max_tokens)."""
    tokens = b.op("Tokenizer", cased, domain="com.microsoft", mark=0, mincharnum=1, pad_value=PAD_TOKEN,
                  tokenexp=tokenizer.re2_expression())                               # (N, K) strings
    width = b.const([tokenizer.max_tokens], TensorProto.INT64)
    start, axis = b.const([0], TensorProto.INT64), b.const([1], TensorProto.INT64)
    kept = b.op("Slice", tokens, start, width, axis)                                 # (N, min(K, T))
    found = b.op("LabelEncoder", kept, domain="ai.onnx.ml", keys_strings=[PAD_TOKEN, *tokenizer.vocabulary],
                 values_int64s=[PAD, *range(FIRST_WORD, FIRST_WORD + len(tokenizer.vocabulary))],
                 default_int64=UNKNOWN)
    padded_to(b, found, cased, tokenizer.max_tokens, ids)


def padded_to(b: GraphNodes, found: str, rows_of: str, width: int, out: str) -> None:
    """`out` (N, width): the first `width` columns of `found` (N, K), padded with PAD (N read off `rows_of` [N])."""
    size, start, axis = (b.const([value], TensorProto.INT64) for value in (width, 0, 1))
    zeros = b.op("ConstantOfShape", b.op("Concat", b.op("Shape", rows_of), size, axis=0),
                 value=helper.make_tensor("value", TensorProto.INT64, [1], [PAD]))   # (N, width)
    padded = b.op("Concat", found, zeros, axis=1)                                    # (N, K + width)
    b.nodes.append(helper.make_node("Slice", [padded, start, size, axis], [out]))


def gram_nodes(b: GraphNodes, grams: CharGrams, cased: str, out: str) -> None:
    """The lower-cased strings [N] -> their character n-grams' ids (N, slots), by grams.py's rule: the first `chars`
    code points (one anchored RE2 match), split into code points and padded past each text's end with "" (high more
    columns, so every size has a column); each size's grams by StringConcat of shifted slices, valid where the last
    character is real (a gram cut by the end is a shorter string and could match another size's entry); ids by
    LabelEncoder (0 outside the vocabulary); then the non-zero ids moved to the front in order (TopK of their
    positions) and the first `slots` kept."""
    def i64(value) -> str:
        return b.const(value, TensorProto.INT64)

    empty = b.const(PAD_TOKEN, TensorProto.STRING)
    prefix = b.op("Tokenizer", cased, domain="com.microsoft", mark=0, mincharnum=1, pad_value=PAD_TOKEN,
                  tokenexp=f"^(?s:.){{1,{grams.chars}}}")                           # (N, 0 or 1)
    chars = b.op("Flatten", b.op("Tokenizer", prefix, domain="com.microsoft", mark=0, mincharnum=1,
                                 pad_value=PAD_TOKEN, tokenexp="(?s:.)"), axis=1)      # (N, L)
    past_end = b.op("Expand", b.const([PAD_TOKEN], TensorProto.STRING),
                    b.op("Concat", b.op("Shape", cased), i64([grams.high]), axis=0))
    chars = b.op("Concat", chars, past_end, axis=1)                                  # (N, L + high)
    columns = b.op("Shape", chars, start=1, end=2)
    found, valid = [], []
    for size in range(grams.low, grams.high + 1):
        stop = b.op("Sub", columns, i64([size - 1]))
        shifted = [b.op("Slice", chars, i64([j]), b.op("Add", stop, i64([j])), i64([1])) for j in range(size)]
        gram = shifted[0]
        for part in shifted[1:]:
            gram = b.op("StringConcat", gram, part)
        found.append(gram)
        valid.append(b.op("Not", b.op("Equal", shifted[-1], empty)))
    zero = i64([0])
    ids = b.op("LabelEncoder", b.op("Concat", *found, axis=1), domain="ai.onnx.ml",
               keys_strings=list(grams.vocabulary), default_int64=0,
               values_int64s=list(range(grams.first_id, grams.first_id + len(grams.vocabulary))))
    ids = b.op("Where", b.op("Concat", *valid, axis=1), ids, zero)                   # (N, G)
    count = b.op("Shape", ids, start=1, end=2)
    position = b.op("Range", i64(0), b.op("Squeeze", count, zero), i64(1))         # (G,)
    key = b.op("Where", b.op("Greater", ids, zero), position, b.op("Add", position, i64(1 << 40)))
    _, order = b.op("TopK", key, b.op("Min", count, i64([grams.slots])), axis=1, largest=0, sorted=1, outputs=2)
    padded_to(b, b.op("GatherElements", ids, order, axis=1), cased, grams.slots, out)


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
    """The front end alone: `text` strings [N] -> `ids` (N, width) int64, checked."""
    b = GraphNodes("text")
    front_nodes(b, tokenizer, TEXT_INPUT, IDS)
    graph = helper.make_graph(b.nodes, "torchship-text-front", [text_input()],
                              [helper.make_tensor_value_info(IDS, TensorProto.INT64, ["batch", tokenizer.width])])
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
    if tokens and tokens != tokenizer.width:
        raise ValueError(f"the model takes {tokens} token ids per text, the tokenizer gives {tokenizer.width}")
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
