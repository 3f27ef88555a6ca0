"""Running an ONNX model on the CPU: the one session set-up and softmax that tasks and serving share."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

Runner = Callable[[np.ndarray], np.ndarray]   # encoded rows (N, F) float32 -> logits (N, C)


def open_onnx(path: Path, threads: int):
    """An ONNX Runtime session on the CPU with `threads` intra-op threads (chosen on purpose: 2-core
    boxes collapse when a process takes more threads than it has cores to itself)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_runner(path: Path, threads: int) -> Runner:
    """rows -> logits backed by ONNX Runtime."""
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


def predict_proba(session, schema, rows) -> np.ndarray:
    """Raw rows (a DataFrame with the schema's feature columns) -> class probabilities (N, C)."""
    from tasks.contract import encode_features

    return softmax(session.run(None, {"x": encode_features(rows, schema)})[0])
