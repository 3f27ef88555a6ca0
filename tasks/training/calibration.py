"""Temperature scaling of the served probabilities: when the expected calibration error of predictions on rows a
model never trained on exceeds MAX_ECE, fit the one temperature T that minimises their negative log-likelihood.
T divides log-probabilities, so the argmax (and every accuracy or F1 figure) stays; only confidence moves, which is
what the monitor's label-free accuracy estimate (tasks/monitoring/estimate.py) reads.

The rows are the out-of-fold predictions for cross-validated members (tasks/training/crossval.py), the validation
split for a single model (`calibrate_single`); either way the temperature is carried in the served graph. The
figures are pure numpy: log-probabilities and labels in, figures out."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.ensemble import FoldEnsemble
from tasks.training.loop import predict_logits

# Above this, the served probabilities are off by more than two points on average: worth a temperature.
MAX_ECE = 0.02
ECE_BINS = 15
# log-spaced candidates: a grid is exact enough for one scalar, needs no optimiser, and cannot diverge.
TEMPERATURES = np.exp(np.linspace(np.log(0.05), np.log(20.0), 601))
COARSE = 30   # fit_temperature's first pass: every 30th candidate (0, 30, ..., 600: both ends included)


def tempered(log_probs: np.ndarray, temperature: float) -> np.ndarray:
    """(N, C) softmax(log_probs / T)."""
    scaled = log_probs / temperature
    scaled = scaled - scaled.max(axis=1, keepdims=True)
    exp = np.exp(scaled)
    return exp / exp.sum(axis=1, keepdims=True)


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Top-label ECE: the row-weighted gap between confidence and accuracy over equal-width confidence bins."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    gap = 0.0
    for b in np.unique(which):
        rows = which == b
        gap += rows.mean() * abs(correct[rows].mean() - confidence[rows].mean())
    return float(gap)


def fit_temperature(log_probs: np.ndarray, labels: np.ndarray) -> float:
    """The T in TEMPERATURES with the lowest negative log-likelihood of softmax(log_probs / T). That likelihood is
    convex in 1/T (a log-sum-exp of functions linear in it, less one), so along the grid it falls, then rises: every
    COARSE-th candidate first, then those between the best one's neighbours find the T that trying all 601 finds,
    in a tenth of the work (1 s of the train stage on 15k validation rows, 10 s on 150k)."""
    picked = log_probs[np.arange(len(labels)), labels]

    def nll(index: int) -> float:
        scaled = log_probs / TEMPERATURES[index]
        top = scaled.max(axis=1)
        log_norm = top + np.log(np.exp(scaled - top[:, None]).sum(axis=1))   # logsumexp per row
        return float(np.mean(log_norm - picked / TEMPERATURES[index]))

    best = min(range(0, len(TEMPERATURES), COARSE), key=nll)   # the first of equals, as np.argmin
    return float(TEMPERATURES[min(range(max(0, best - COARSE + 1), min(len(TEMPERATURES), best + COARSE)), key=nll)])


def calibrate(log_probs: np.ndarray, labels: np.ndarray) -> dict:
    """{temperature, ece_before, ece_after, max_ece}: T = 1 unless the out-of-fold ECE exceeds MAX_ECE and the
    fitted T lowers it (the likelihood-optimal T usually does; where it does not, confidence is left alone)."""
    before = expected_calibration_error(tempered(log_probs, 1.0), labels)
    temperature, after = 1.0, before
    if before > MAX_ECE:
        fitted = fit_temperature(log_probs, labels)
        fitted_ece = expected_calibration_error(tempered(log_probs, fitted), labels)
        if fitted_ece < before:
            temperature, after = fitted, fitted_ece
    return {"temperature": temperature, "ece_before": before, "ece_after": after, "max_ece": MAX_ECE}


def calibrate_single(model: nn.Module, spec: dict, features: torch.Tensor,
                     labels: np.ndarray) -> tuple[nn.Module, dict, dict]:
    """(the model to serve, its spec, the calibration figures) for one trained model checked on its validation rows:
    itself where they are calibrated, else the model inside a one-member FoldEnsemble that carries the temperature
    (the CV path's served module: softmax(log_softmax(z) / T) = softmax(z / T); `members: 1` rebuilds it)."""
    log_probs = torch.log_softmax(predict_logits(model, features), 1).cpu().numpy().astype(np.float64)
    calibration = calibrate(log_probs, labels)
    if calibration["temperature"] == 1.0:
        return model, spec, calibration
    served = FoldEnsemble([model], calibration["temperature"]).to(features.device).eval()
    return served, {**spec, "members": 1}, calibration
