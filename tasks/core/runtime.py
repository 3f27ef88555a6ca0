"""Running an ONNX model on the CPU: the one session set-up and softmax that tasks and serving share."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[np.ndarray], np.ndarray]   # encoded rows (N, F) float32 -> logits (N, C)
RAW_INPUTS = {"torchship.inputs": "raw"}   # metadata of a served graph: raw inputs in (tasks/modalities/scoring.py)
# Metadata of a binary model: its decision threshold on P(class index 1), fitted on out-of-fold (or validation)
# predictions to maximise the bless metric (tasks/training/decision.py). Absent: the argmax.
THRESHOLD_KEY = "torchship.threshold"
DECISION = "decision"   # a composed graph's output: one-hot (N, C) of the label its decision rule serves
EMBEDDING = "embedding"   # a composed graph's output: (N, k) projection of the model's own embedding


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
    """A composed graph (raw inputs in, softmax inside: each modality's served graph) rather than a bare model on
    its encoded input `x` (a variant, or a table version registered before its graph took raw rows)."""
    metadata = session.get_modelmeta().custom_metadata_map
    return all(metadata.get(key) == value for key, value in RAW_INPUTS.items())


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
