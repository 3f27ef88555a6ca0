"""Scoring a torchship ONNX model on raw inputs, whatever its modality: a served graph takes them as its feed; a
bare model (a variant, or a table version registered before its graph took raw rows) takes them encoded as `x`."""
from __future__ import annotations

import numpy as np

from tasks.core.runtime import DECISION, decide, decision_threshold, softmax, takes_raw_rows
from tasks.modalities import modality_of


def predict_proba(session, schema, inputs) -> np.ndarray:
    """Raw inputs (a frame of rows, pixels, texts, or a feed) -> class probabilities (N, C)."""
    modality = modality_of(schema)
    feed = modality.feed(schema, inputs)
    if takes_raw_rows(session):
        return session.run(["probabilities"], feed)[0]
    return softmax(session.run(None, {"x": modality.bare_inputs(schema, feed)})[0])


def predict_labels(session, schema, inputs) -> np.ndarray:
    """Raw inputs -> the class indices (N,) the model serves: a served graph's own `decision` output where it has
    one (the threshold inside), else the argmax of its probabilities (versions registered before that output)."""
    if takes_raw_rows(session) and DECISION in {output.name for output in session.get_outputs()}:
        return session.run([DECISION], modality_of(schema).feed(schema, inputs))[0].argmax(1)
    return predict_proba(session, schema, inputs).argmax(1)


def served_classes(session, schema, inputs) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, the class indices the service answers) by the model's decision rule (argmax, or the
    threshold its graph's metadata names)."""
    probabilities = predict_proba(session, schema, inputs)
    return probabilities, decide(probabilities, decision_threshold(session.get_modelmeta().custom_metadata_map))
