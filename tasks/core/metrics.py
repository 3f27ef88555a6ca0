"""Classification metrics in plain numpy (cheap enough for every epoch and every gate)."""
from __future__ import annotations

import numpy as np

from tasks.core.runtime import decide, softmax


def confusion(labels: np.ndarray, predicted: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = true class, columns = predicted."""
    return np.bincount(labels * n_classes + predicted, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def class_scores(matrix: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class precision, recall, F1 and support (true rows) of a confusion matrix; 0 where undefined."""
    matrix = matrix.astype(np.float64)
    n_classes = len(matrix)
    true_positive, predicted, actual = np.diag(matrix), matrix.sum(0), matrix.sum(1)
    precision = np.divide(true_positive, predicted, out=np.zeros(n_classes), where=predicted > 0)
    recall = np.divide(true_positive, actual, out=np.zeros(n_classes), where=actual > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n_classes), where=(precision + recall) > 0)
    return {"precision": precision, "recall": recall, "f1": f1, "support": actual}


def metrics_from_confusion(matrix: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 (every class counts equally, whatever its share)."""
    return {"accuracy": float(np.trace(matrix) / max(1.0, float(matrix.sum()))),
            "f1_macro": float(class_scores(matrix)["f1"].mean())}


def classification_metrics(labels: np.ndarray, predicted: np.ndarray, n_classes: int) -> dict[str, float]:
    """Accuracy and macro-F1 (every class counts equally, whatever its share)."""
    return metrics_from_confusion(confusion(np.asarray(labels), np.asarray(predicted), n_classes))


def per_class_metrics(labels: np.ndarray, predicted: np.ndarray, classes: list[str]) -> dict[str, dict[str, float]]:
    """{class: {precision, recall, f1, support}} of predicted class indices against the true ones."""
    scores = class_scores(confusion(np.asarray(labels), np.asarray(predicted), len(classes)))
    return {name: {key: float(values[i]) for key, values in scores.items()} for i, name in enumerate(classes)}


def evaluate(runner, features: np.ndarray, labels: np.ndarray, n_classes: int, batch: int = 4096,
             threshold: float | None = None) -> dict[str, float]:
    """Score a rows -> logits function on a labelled set, in batches, by the served decision rule."""
    return classification_metrics(labels, predict(runner, features, batch, threshold), n_classes)


def predict(runner, features: np.ndarray, batch: int = 4096, threshold: float | None = None) -> np.ndarray:
    """Predicted class indices of a rows -> logits function, in batches: the argmax, or with a binary model's
    `threshold` the rule its served graph applies (tasks.core.runtime.decide)."""
    def labels(logits: np.ndarray) -> np.ndarray:
        return logits.argmax(1) if threshold is None else decide(softmax(logits), threshold)

    return np.concatenate([labels(runner(features[i:i + batch])) for i in range(0, len(features), batch)])


def balances_classes(metric: str) -> bool:
    """Whether a model judged on `metric` should weight classes as balanced (n / (k * count)): macro-F1 counts
    every class equally, so its loss and its baselines do too; accuracy counts rows, so neither weights them."""
    return metric == "f1_macro"


def paired_bootstrap(labels: np.ndarray, first: np.ndarray, second: np.ndarray, n_classes: int, metric: str,
                     resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """metric(first) - metric(second) on the same rows, with a paired bootstrap interval: each resample draws
    one set of row indices and scores both predictions on it, so the noise they share cancels."""
    labels, first, second = np.asarray(labels), np.asarray(first), np.asarray(second)
    cells = n_classes * n_classes
    first_codes, second_codes = labels * n_classes + first, labels * n_classes + second  # confusion cells per row
    point = (metrics_from_confusion(confusion(labels, first, n_classes))[metric]
             - metrics_from_confusion(confusion(labels, second, n_classes))[metric])
    rng = np.random.default_rng(seed)
    differences = np.empty(resamples)
    for i in range(resamples):
        rows = rng.integers(0, len(labels), len(labels))
        first_confusion = np.bincount(first_codes[rows], minlength=cells).reshape(n_classes, n_classes)
        second_confusion = np.bincount(second_codes[rows], minlength=cells).reshape(n_classes, n_classes)
        differences[i] = (metrics_from_confusion(first_confusion)[metric]
                          - metrics_from_confusion(second_confusion)[metric])
    tail = (1 - confidence) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    return {"difference": float(point), "low": float(low), "high": float(high), "confidence": confidence,
            "resamples": resamples}


def bootstrap_drop(labels: np.ndarray, reference: np.ndarray, variant: np.ndarray, n_classes: int, metric: str,
                   resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Metric drop (reference - variant) on the same rows, with its paired bootstrap interval."""
    result = paired_bootstrap(labels, reference, variant, n_classes, metric, resamples, confidence, seed)
    return {"drop": result.pop("difference"), **result}


def best_baseline(report: dict, metric: str) -> tuple[str, float]:
    """(name, score) of the best model in a baseline report's `models` on `metric`."""
    name = max(report["models"], key=lambda model: report["models"][model][metric])
    return name, report["models"][name][metric]
