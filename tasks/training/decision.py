"""The decision rule a binary model is served with: the threshold on P(class 1) that maximises the
bless metric on out-of-fold predictions (cross-validation) or, for a single model, on the validation split.

A threshold fitted on a few hundred rows easily fits their noise, so it moves from 0.5 only when that pays by at
least MIN_GAIN of the metric, and among equally good thresholds the one nearest 0.5 is kept. Multi-class models
keep the argmax, shifted by log class priors where out-of-fold evidence says the other class weighting pays
(`fit_class_weighting`). Both are fitted on the calibrated probabilities (after the temperature), which are the
ones the served graph outputs. Pure numpy: probabilities and labels in, the rule and its figures out."""
from __future__ import annotations

import numpy as np

from tasks.core.metrics import classification_metrics
from tasks.core.runtime import decide

DEFAULT_THRESHOLD = 0.5
# Candidates 0.05 .. 0.95 by 0.01: finer steps only fit the out-of-fold rows better, not new ones.
THRESHOLDS = np.round(np.linspace(0.05, 0.95, 91), 2)
# Half a point of the metric: below that a moved threshold is as likely noise as gain (on 400 out-of-fold rows
# one row's flip moves accuracy by a quarter of a point).
MIN_GAIN = 0.005


def fit_threshold(probabilities: np.ndarray, labels: np.ndarray, metric: str, source: str) -> dict | None:
    """{threshold, metric, source, at_default, at_threshold, min_gain, rows} for a binary model's (N, 2)
    `probabilities`; None for more classes (they keep the argmax). `source`: which rows, e.g. "out-of-fold"."""
    if probabilities.shape[1] != 2:
        return None
    scores = np.array([classification_metrics(labels, decide(probabilities, t), 2)[metric] for t in THRESHOLDS])
    at_default = classification_metrics(labels, decide(probabilities, DEFAULT_THRESHOLD), 2)[metric]
    best = np.flatnonzero(scores == scores.max())
    nearest = best[np.argmin(np.abs(THRESHOLDS[best] - DEFAULT_THRESHOLD))]   # a tie goes toward 0.5
    moved = scores[nearest] - at_default >= MIN_GAIN
    threshold = float(THRESHOLDS[nearest]) if moved else DEFAULT_THRESHOLD
    return {"threshold": threshold, "metric": metric, "source": source, "at_default": float(at_default),
            "at_threshold": float(scores[nearest]) if moved else float(at_default), "min_gain": MIN_GAIN,
            "rows": int(len(labels))}


def decision_headline(decision: dict | None) -> str:
    """e.g. 'threshold 0.31 (out-of-fold f1_macro 0.8120 vs 0.7904 at 0.5)', or '' for a multi-class model."""
    if not decision:
        return ""
    if decision["threshold"] == DEFAULT_THRESHOLD:
        return (f"threshold 0.5 ({decision['source']} {decision['metric']} {decision['at_default']:.4f}; no other "
                f"gains {decision['min_gain']} or more)")
    return (f"threshold {decision['threshold']:.2f} ({decision['source']} {decision['metric']} "
            f"{decision['at_threshold']:.4f} vs {decision['at_default']:.4f} at 0.5)")


def fit_class_weighting(log_probs: np.ndarray, labels: np.ndarray, metric: str, balanced: bool) -> dict | None:
    """Whether the members' class weighting or the other one serves the bless `metric` better on out-of-fold
    (N, C) `log_probs` of a multi-class model (None for binary ones: their threshold already moves the decision).
    A loss weighted by 1 / prior_c learns p(c|x) / prior_c, so adding log prior_c to the log-probabilities gives
    what unweighted training would have decided, and subtracting it what balanced training would: one shift, no
    second training. {weighting, class_bias (the shift, zeros when kept), metric, at_trained, at_other, rows};
    the other weighting only when it gains MIN_GAIN or more."""
    n_classes = log_probs.shape[1]
    if n_classes == 2:
        return None
    prior = np.bincount(labels, minlength=n_classes) / len(labels)
    shift = (1.0 if balanced else -1.0) * np.log(np.maximum(prior, 1e-12))
    at_trained = classification_metrics(labels, log_probs.argmax(1), n_classes)[metric]
    at_other = classification_metrics(labels, (log_probs + shift).argmax(1), n_classes)[metric]
    switched = at_other - at_trained >= MIN_GAIN
    trained, other = ("balanced", "none") if balanced else ("none", "balanced")
    return {"weighting": other if switched else trained, "trained_with": trained,
            "class_bias": [float(v) for v in (shift if switched else np.zeros(n_classes))], "metric": metric,
            "at_trained": float(at_trained), "at_other": float(at_other), "min_gain": MIN_GAIN,
            "rows": int(len(labels))}
