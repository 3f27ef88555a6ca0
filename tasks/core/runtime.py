"""Running an ONNX model on the CPU: the one session set-up and softmax that tasks and serving share."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.core.encoding import encode_features, raw_columns

Runner = Callable[[np.ndarray], np.ndarray]   # encoded rows (N, F) float32 -> logits (N, C)
RAW_INPUTS = {"torchship.inputs": "raw"}   # metadata of a graph with one input per feature column
# Metadata of a binary model: its decision threshold on P(class index 1), fitted on out-of-fold (or validation)
# predictions to maximise the bless metric (tasks/training/decision.py). Absent: the argmax.
THRESHOLD_KEY = "torchship.threshold"
DECISION = "decision"   # a composed graph's output: one-hot (N, C) of the label its decision rule serves
IMAGE_INPUT = "image"   # a composed image graph's input: uint8 (N, H, W, C) pixels at the model's size
EMBEDDING = "embedding"   # a composed image graph's output: (N, k) projection of the model's own embedding


def open_onnx(path: Path | bytes, threads: int):
    """An ONNX Runtime session on the CPU (of a file, or of a serialised model) with `threads` intra-op threads
    (chosen on purpose: 2-core boxes collapse when a process takes more threads than it has cores to itself)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def onnx_runner(path: Path, threads: int) -> Runner:
    """rows -> logits backed by ONNX Runtime, for a bare model (input `x`: an exported or compressed variant)."""
    session = open_onnx(path, threads)
    return lambda rows: session.run(None, {"x": rows})[0]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise probabilities, stable for large logits."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def onnx_metadata(path: Path) -> dict[str, str]:
    """The key/value metadata an ONNX file carries (torchship writes the schema there)."""
    import onnx

    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def takes_raw_rows(session) -> bool:
    """A composed graph (tasks/variants/preprocess.py: one input per feature column, softmax inside) rather
    than a bare model on the encoded matrix `x` (every version registered before that change)."""
    metadata = session.get_modelmeta().custom_metadata_map
    return all(metadata.get(key) == value for key, value in RAW_INPUTS.items())


def model_inputs(session, schema, rows) -> dict[str, np.ndarray]:
    """The feed of a composed graph: `raw_columns` of raw rows (a DataFrame with the schema's feature columns), or
    for an image model its pixels ((N, H, W, C) uint8) as `image`."""
    return {IMAGE_INPUT: rows} if schema.is_image else raw_columns(rows, schema)


def predict_proba(session, schema, rows) -> np.ndarray:
    """Raw rows (a DataFrame with the schema's feature columns; images: (N, H, W, C) uint8 pixels) -> class
    probabilities (N, C), from either kind of torchship model: a composed graph takes its raw inputs, a bare one the
    encoded matrix (or the pixels) as `x`."""
    if takes_raw_rows(session):
        return session.run(["probabilities"], model_inputs(session, schema, rows))[0]
    return softmax(session.run(None, {"x": rows if schema.is_image else encode_features(rows, schema)})[0])


def decision_threshold(metadata: dict[str, str]) -> float | None:
    """The threshold a model's metadata carries (None: it answers the argmax)."""
    value = metadata.get(THRESHOLD_KEY)
    return None if value is None else float(value)


def decide(probabilities: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Class indices (N,): the argmax, or with a threshold (binary models) class 1 where P(class 1) > threshold.
    The rule a composed graph's `decision` output computes, compared in float32 as the graph does, so a service
    that scores the graph's probabilities answers the graph's own labels."""
    if threshold is None:
        return probabilities.argmax(1)
    return (probabilities[:, 1] > np.float32(threshold)).astype(np.int64)


def predict_labels(session, schema, rows) -> np.ndarray:
    """Raw rows (or images) -> the class indices (N,) the model serves: a composed graph's own `decision` output
    where it has one (the threshold inside), else the argmax of its probabilities (versions registered before that
    output)."""
    if takes_raw_rows(session) and DECISION in {output.name for output in session.get_outputs()}:
        return session.run([DECISION], model_inputs(session, schema, rows))[0].argmax(1)
    return predict_proba(session, schema, rows).argmax(1)
