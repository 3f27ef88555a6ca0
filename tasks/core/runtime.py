"""Running an ONNX model on the CPU: the one session set-up and softmax that tasks and serving share."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.core.encoding import encode_features, raw_columns

Runner = Callable[[np.ndarray], np.ndarray]   # encoded rows (N, F) float32 -> logits (N, C)
RAW_INPUTS = {"torchship.inputs": "raw"}   # metadata of a graph with one input per feature column
# Metadata of a binary graph served with a decision threshold on the second class's probability (schema order);
# without it the served class is the argmax.
DECISION_THRESHOLD = "torchship.decision_threshold"


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


def decision_threshold(metadata: dict[str, str]) -> float | None:
    """The served graph's decision threshold (its metadata), or None for argmax."""
    value = metadata.get(DECISION_THRESHOLD)
    return None if value in (None, "") else float(value)


def decide(probabilities: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """(N,) the class index the service answers for (N, C) probabilities: the argmax or, for a binary graph with a
    threshold, class 1 where its probability reaches the threshold."""
    if threshold is None or probabilities.shape[1] != 2:
        return probabilities.argmax(axis=1)
    return (probabilities[:, 1] >= threshold).astype(np.int64)


def takes_raw_rows(session) -> bool:
    """A composed graph (tasks/variants/preprocess.py: one input per feature column, softmax inside) rather
    than a bare model on the encoded matrix `x` (every version registered before that change)."""
    metadata = session.get_modelmeta().custom_metadata_map
    return all(metadata.get(key) == value for key, value in RAW_INPUTS.items())


def predict_proba(session, schema, rows) -> np.ndarray:
    """Raw rows (a DataFrame with the schema's feature columns) -> class probabilities (N, C), from either kind
    of torchship model: a composed graph takes `raw_columns`, a bare one the encoded matrix."""
    if takes_raw_rows(session):
        return session.run(["probabilities"], raw_columns(rows, schema))[0]
    return softmax(session.run(None, {"x": encode_features(rows, schema)})[0])
