"""Temperature scaling (tasks/training/calibration.py): the ECE is the textbook figure, the fitted temperature
recovers a known over-confidence, it is applied only above MAX_ECE and never moves the argmax; a single model
(not cross-validated) gets the same check on its validation rows, and its temperature travels with its weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import build_model
from tasks.training.calibration import (
    MAX_ECE,
    TEMPERATURES,
    calibrate,
    calibrate_single,
    expected_calibration_error,
    fit_temperature,
    tempered,
)
from tasks.training.loop import predict_logits
from tasks.training.weights import load_trained, save_trained

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


def every_candidate(log_probs: np.ndarray, labels: np.ndarray) -> float:
    """The temperature with the lowest negative log-likelihood, trying each of TEMPERATURES (the reference)."""
    from scipy.special import logsumexp

    picked = log_probs[np.arange(len(labels)), labels]
    nll = [np.mean(logsumexp(log_probs / t, axis=1) - picked / t) for t in TEMPERATURES]
    return float(TEMPERATURES[int(np.argmin(nll))])


@pytest.mark.parametrize("sharpen", [0.05, 0.4, 1.0, 2.5, 30.0])
def test_the_coarse_to_fine_search_finds_the_temperature_trying_all_finds(sharpen):
    log_probs, labels = sampled(800, sharpen, seed=int(sharpen * 10))
    assert fit_temperature(log_probs, labels) == pytest.approx(every_candidate(log_probs, labels), rel=1e-12)
    separable = log_probs.argmax(1)   # the likelihood only falls as T shrinks: the smallest candidate
    assert fit_temperature(log_probs, separable) == every_candidate(log_probs, separable) == TEMPERATURES[0]


def test_an_overconfident_model_is_tempered_and_keeps_every_argmax():
    log_probs, labels = sampled(5000, sharpen=3.0)
    result = calibrate(log_probs, labels)
    assert result["ece_before"] > MAX_ECE and result["temperature"] > 2 and result["ece_after"] < MAX_ECE
    assert np.array_equal(tempered(log_probs, result["temperature"]).argmax(1), log_probs.argmax(1))


def test_a_calibrated_model_is_left_alone():
    log_probs, labels = sampled(20000, sharpen=1.0)
    result = calibrate(log_probs, labels)
    assert result["ece_before"] <= MAX_ECE and result["temperature"] == 1.0


def test_a_single_overconfident_model_is_served_tempered_and_rebuilds_from_its_weights(encoded, tmp_path):
    """The non-cross-validated path: checked on its validation rows, tempered inside the served module (a one-member
    FoldEnsemble), and what save_trained writes rebuilds that module, temperature included."""
    torch.manual_seed(0)
    spec = {"name": "linear", "kwargs": {}}
    model = build_model(spec["name"], encoded.layout, **spec["kwargs"])
    with torch.no_grad():   # an untrained model made 10x too sure of itself
        model.body.weight.mul_(10.0)
        model.body.bias.mul_(10.0)
    labels = encoded.val.labels.numpy()
    served, served_spec, figures = calibrate_single(model, spec, encoded.val.features, labels)
    assert figures["ece_before"] > MAX_ECE and figures["temperature"] > 2
    assert figures["ece_after"] < figures["ece_before"]
    assert served_spec == {**spec, "members": 1}
    raw, tempered_logits = predict_logits(model, encoded.val.features), predict_logits(served, encoded.val.features)
    assert torch.equal(raw.argmax(1), tempered_logits.argmax(1))
    save_trained(tmp_path / "model.pt", served, encoded.layout, served_spec, ["no", "yes"], "table")
    rebuilt, _ = load_trained(tmp_path / "model.pt")
    assert torch.allclose(predict_logits(rebuilt, encoded.val.features), tempered_logits)


def test_a_single_model_already_calibrated_is_served_as_it_is(encoded):
    model = build_model("linear", encoded.layout)
    with torch.no_grad():   # one constant answer at the validation rows' own class shares: ECE 0
        model.body.weight.zero_()
        share = float(encoded.val.labels.float().mean())
        model.body.bias.copy_(torch.log(torch.tensor([1 - share, share])))
    served, spec, figures = calibrate_single(model, {"name": "linear", "kwargs": {}}, encoded.val.features,
                                             encoded.val.labels.numpy())
    assert served is model and spec == {"name": "linear", "kwargs": {}} and figures["temperature"] == 1.0
