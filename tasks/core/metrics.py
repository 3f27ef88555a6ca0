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


def evaluate(runner, features: np.ndarray, labels: np.ndarray, n_classes: int, batch: int = 4096) -> dict[str, float]:
    """Score a rows -> logits function on a labelled set, in batches."""
    return classification_metrics(labels, predict(runner, features, batch), n_classes)


def predict(runner, features: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Predicted class indices of a rows -> logits function, in batches."""
    return np.concatenate([runner(features[i:i + batch]).argmax(1) for i in range(0, len(features), batch)])


def bootstrap_drop(labels: np.ndarray, reference: np.ndarray, variant: np.ndarray, n_classes: int, metric: str,
                   resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Metric drop (reference - variant) on the same rows, with a paired bootstrap interval: each resample
    scores both predictions on the same drawn rows, so their shared noise cancels."""
    labels, reference, variant = np.asarray(labels), np.asarray(reference), np.asarray(variant)
    point = (classification_metrics(labels, reference, n_classes)[metric]
             - classification_metrics(labels, variant, n_classes)[metric])
    rng = np.random.default_rng(seed)
    drops = np.empty(resamples)
    for i in range(resamples):
        rows = rng.integers(0, len(labels), len(labels))
        drops[i] = (classification_metrics(labels[rows], reference[rows], n_classes)[metric]
                    - classification_metrics(labels[rows], variant[rows], n_classes)[metric])
    tail = (1 - confidence) / 2
    low, high = np.quantile(drops, [tail, 1 - tail])
    return {"drop": float(point), "low": float(low), "high": float(high), "confidence": confidence,
            "resamples": resamples}
