"""Temperature scaling from out-of-fold predictions (tasks/training/calibration.py): the ECE is the textbook
figure, the fitted temperature recovers a known over-confidence, it is applied only above MAX_ECE and never moves
the argmax."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.training.calibration import MAX_ECE, calibrate, expected_calibration_error, fit_temperature, tempered

pytestmark = pytest.mark.model


def sampled(rows: int, sharpen: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from softmax(z), and the log-probabilities of a model that reports softmax(sharpen * z)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (rows, 3))
    truth = tempered(logits, 1.0)
    labels = (rng.random(rows)[:, None] > truth.cumsum(1)).sum(1)
    reported = sharpen * logits
    return reported - np.log(np.exp(reported).sum(1, keepdims=True)), labels


def test_ece_by_hand():
    probabilities = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    labels = np.array([0, 1, 0, 1])
    # bins: 0.9 (2 rows, accuracy 0.5: gap 0.4), 0.6 (1 row, right: gap 0.4), 0.7 (1 row, right: gap 0.3)
    assert expected_calibration_error(probabilities, labels) == pytest.approx(0.5 * 0.4 + 0.25 * 0.4 + 0.25 * 0.3)


def test_the_fitted_temperature_undoes_a_known_overconfidence():
    log_probs, labels = sampled(5000, sharpen=3.0)
    assert fit_temperature(log_probs, labels) == pytest.approx(3.0, rel=0.15)


def test_an_overconfident_model_is_tempered_and_keeps_every_argmax():
    log_probs, labels = sampled(5000, sharpen=3.0)
    result = calibrate(log_probs, labels)
    assert result["ece_before"] > MAX_ECE and result["temperature"] > 2 and result["ece_after"] < MAX_ECE
    assert np.array_equal(tempered(log_probs, result["temperature"]).argmax(1), log_probs.argmax(1))


def test_a_calibrated_model_is_left_alone():
    log_probs, labels = sampled(20000, sharpen=1.0)
    result = calibrate(log_probs, labels)
    assert result["ece_before"] <= MAX_ECE and result["temperature"] == 1.0
