"""Classification metrics in plain numpy (cheap enough for every epoch and every gate)."""
from __future__ import annotations

import numpy as np


def confusion(labels: np.ndarray, predicted: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = true class, columns = predicted."""
    return np.bincount(labels * n_classes + predicted, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def classification_metrics(labels: np.ndarray, predicted: np.ndarray, n_classes: int) -> dict[str, float]:
    """Accuracy and macro-F1 (every class counts equally, whatever its share)."""
    matrix = confusion(np.asarray(labels), np.asarray(predicted), n_classes).astype(np.float64)
    true_positive = np.diag(matrix)
    precision = np.divide(true_positive, matrix.sum(0), out=np.zeros(n_classes), where=matrix.sum(0) > 0)
    recall = np.divide(true_positive, matrix.sum(1), out=np.zeros(n_classes), where=matrix.sum(1) > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n_classes), where=(precision + recall) > 0)
    return {"accuracy": float(true_positive.sum() / max(1.0, matrix.sum())), "f1_macro": float(f1.mean())}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def evaluate(runner, features: np.ndarray, labels: np.ndarray, n_classes: int, batch: int = 4096) -> dict[str, float]:
    """Score a rows -> logits function on a labelled set, in batches."""
    predicted = np.concatenate([runner(features[i:i + batch]).argmax(1) for i in range(0, len(features), batch)])
    return classification_metrics(labels, predicted, n_classes)
