"""tasks/core/metrics.py: the numpy metrics against scikit-learn (the same thing computed two ways)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

from tasks.core.metrics import classification_metrics, confusion, evaluate
from tasks.core.runtime import softmax


def sklearn_reference(labels, predicted, n_classes):
    return {"accuracy": accuracy_score(labels, predicted),
            "f1_macro": f1_score(labels, predicted, average="macro", labels=list(range(n_classes)), zero_division=0)}


@pytest.mark.parametrize("seed, n_classes, rows", [(0, 2, 50), (1, 3, 200), (2, 10, 500), (3, 4, 7)])
def test_metrics_match_sklearn_on_random_labels(seed, n_classes, rows):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, rows)
    predicted = np.where(rng.random(rows) < 0.6, labels, rng.integers(0, n_classes, rows))
    ours = classification_metrics(labels, predicted, n_classes)
    assert ours == pytest.approx(sklearn_reference(labels, predicted, n_classes), abs=1e-12)


def test_a_class_never_predicted_counts_as_zero_f1():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, 300)
    predicted = np.where(labels == 2, 0, labels)  # class 2 is never predicted
    ours = classification_metrics(labels, predicted, 3)
    assert ours == pytest.approx(sklearn_reference(labels, predicted, 3), abs=1e-12)
    assert ours["f1_macro"] < 2 / 3 + 1e-9  # at most two of three classes can score


def test_constant_predictor_on_imbalanced_labels():
    labels = np.array([0] * 80 + [1] * 20)
    ours = classification_metrics(labels, np.zeros(100, dtype=int), 2)
    assert ours["accuracy"] == pytest.approx(0.8)
    assert ours["f1_macro"] == pytest.approx(f1_score(labels, np.zeros(100, dtype=int), average="macro",
                                                      zero_division=0))


def test_confusion_matches_sklearn():
    rng = np.random.default_rng(9)
    labels, predicted = rng.integers(0, 4, 100), rng.integers(0, 4, 100)
    np.testing.assert_array_equal(confusion(labels, predicted, 4), confusion_matrix(labels, predicted, labels=range(4)))


def test_softmax_rows_sum_to_one_and_survive_large_logits():
    logits = np.array([[1000.0, 1000.0], [0.0, np.log(3.0)], [-5.0, 5.0]])
    probabilities = softmax(logits)
    assert np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(1), 1.0)
    np.testing.assert_allclose(probabilities[1], [0.25, 0.75])


def test_evaluate_scores_a_runner_in_batches():
    rng = np.random.default_rng(4)
    features = rng.normal(size=(103, 3)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(int)

    def runner(rows):  # logits favour class 1 when the first feature is positive
        return np.stack([-rows[:, 0], rows[:, 0]], axis=1)

    assert evaluate(runner, features, labels, 2, batch=10) == {"accuracy": 1.0, "f1_macro": 1.0}
    flipped = evaluate(runner, features, 1 - labels, 2, batch=10)
    assert flipped["accuracy"] == 0.0


def test_bootstrap_drop_is_zero_for_identical_predictions_and_brackets_a_real_drop():
    from tasks.core.metrics import bootstrap_drop

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 2000)
    same = bootstrap_drop(labels, labels, labels, 2, "accuracy", resamples=200)
    assert same["drop"] == same["low"] == same["high"] == 0.0
    worse = labels.copy()
    worse[:200] = 1 - worse[:200]           # 10% wrong: accuracy drop exactly 0.10
    result = bootstrap_drop(labels, labels, worse, 2, "accuracy", resamples=400, confidence=0.9)
    assert result["drop"] == pytest.approx(0.10)
    assert result["low"] < 0.10 < result["high"] and result["high"] - result["low"] < 0.05
