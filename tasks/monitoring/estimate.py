"""A label-free estimate of accuracy (confidence-based, as NannyML's CBPE): for calibrated probabilities, the
chance a served answer is right is the probability the model gave the class it answered, so the expected
accuracy of a window is the mean of those probabilities. It reads only what the service logged (its
probabilities and its answer, tasks/core/servelog.py), so it needs no label.

Calibrated means per served class, and a temperature (tasks/training/calibration.py) is not always enough:
training weighs classes to balance them, which moves every probability toward the rare classes, and a decision
threshold serves classes that are not the most probable. So, as CBPE does, the served class's probability is
mapped to the chance it is right by a `Reliability` curve per served class, fitted where labels exist (the
holdout, scored when the monitor runs); for calibrated probabilities that map stays the identity.

It holds while P(y|x) stays what the model learned (covariate shift: the inputs move, the labelling does not).
Under concept shift it is blind: the model is as confident as before and wrong more (or less) often
(docs/closed-loop.md, bench/results/estimate.json)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel

PROBABILITIES = "probabilities"   # the window's column of logged {class: probability}
# How much evidence a correction needs, as a ridge on (slope - 1, intercept) in nats: on a holdout of a few hundred
# rows, the noise in its own accuracy (about 2 points) must not move every estimate; on thousands of rows a real
# distortion (class weights move the log-odds by log 4 on the default data) wins easily.
PRIOR_STRENGTH = 20.0
NEWTON_STEPS = 30
EDGE = 1e-6   # probabilities kept inside (EDGE, 1 - EDGE): log-odds stay finite


@dataclass(frozen=True)
class Reliability:
    """P(the answer is right | served class, its probability), fitted on labelled rows: per served class, a
    logistic map of the probability's log-odds, logit P(right) = slope * logit(p) + intercept (Platt scaling),
    shrunk toward the identity (slope 1, intercept 0). A class never served there keeps the identity."""

    curves: dict[int, tuple[float, float]]   # served class -> (slope, intercept)

    def chance_right(self, confidence: np.ndarray, decided: np.ndarray) -> np.ndarray:
        """(N,) the chance each answer is right, from its served-class probability."""
        log_odds = log_odds_of(confidence)
        for served, (slope, intercept) in self.curves.items():
            rows = decided == served
            log_odds[rows] = slope * log_odds[rows] + intercept
        return 1 / (1 + np.exp(-log_odds))


def log_odds_of(probability: np.ndarray) -> np.ndarray:
    clipped = np.clip(probability, EDGE, 1 - EDGE)
    return np.log(clipped) - np.log1p(-clipped)


def fit_platt(log_odds: np.ndarray, right: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) maximising the log-likelihood of `right` minus PRIOR_STRENGTH / 2 * |(slope - 1,
    intercept)|^2, by Newton's method from the identity (the ridge keeps the Hessian positive definite)."""
    design = np.stack([log_odds, np.ones_like(log_odds)], axis=1)    # (N, 2)
    identity = np.array([1.0, 0.0])
    theta = identity.copy()
    for _ in range(NEWTON_STEPS):
        fitted = 1 / (1 + np.exp(-design @ theta))
        gradient = design.T @ (fitted - right) + PRIOR_STRENGTH * (theta - identity)
        hessian = (design * (fitted * (1 - fitted))[:, None]).T @ design + PRIOR_STRENGTH * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), float(theta[1])


def fit_reliability(probabilities: np.ndarray, decided: np.ndarray, labels: np.ndarray) -> Reliability:
    """The reliability curves of (N, C) probabilities answered as (N,) `decided`, against the true (N,) `labels`."""
    log_odds = log_odds_of(probabilities[np.arange(len(decided)), decided])
    right = (decided == labels).astype(float)
    return Reliability(curves={int(c): fit_platt(log_odds[decided == c], right[decided == c])
                               for c in np.unique(decided)})


@dataclass(frozen=True)
class Holdout:
    """The serving version on the holdout, scored now: what the window's figures are held to."""

    accuracy: float
    estimate: float               # the served probabilities' own estimate there (no curve): how far they are off
    reliability: Reliability | None = None


class Estimate(BaseModel):
    rows: int                     # window rows with logged probabilities the estimate averages
    accuracy: float               # the expected accuracy
    standard_error: float         # how far the realised accuracy of these rows may fall from it (one sd)
    reference_accuracy: float     # the holdout's accuracy
    reference_estimate: float     # the served probabilities' own estimate on the holdout (no reliability curve)
    drop: float                   # reference_accuracy - accuracy


def expected_accuracy(probabilities: np.ndarray, decided: np.ndarray,
                      reliability: Reliability | None = None) -> tuple[float, float]:
    """(expected accuracy, its standard error) of (N, C) probabilities whose served classes are (N,) `decided`:
    each row is right with probability p = its probability of the served class (through `reliability` when
    given), a Bernoulli, so the realised accuracy has mean mean(p) and standard deviation sqrt(sum p (1 - p)) / N."""
    right = probabilities[np.arange(len(decided)), decided]
    if reliability is not None:
        right = reliability.chance_right(right, decided)
    return float(right.mean()), float(np.sqrt(np.sum(right * (1 - right))) / len(right))


def served_probabilities(rows: pd.DataFrame, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(N, C) logged probabilities in `classes` order and (N,) the class each row was answered, for the rows that
    carry both (a log written before probabilities were logged, or an answer outside `classes`, is left out). The
    logged answer is the served decision rule's, whatever it was (argmax or a threshold)."""
    if PROBABILITIES not in rows or "prediction" not in rows or not len(rows):
        return np.zeros((0, len(classes))), np.zeros(0, dtype=np.int64)
    logged = [p if isinstance(p, dict) else {} for p in rows[PROBABILITIES].tolist()]
    matrix = np.array([[float(p.get(c, np.nan)) for c in classes] for p in logged], dtype=float)
    matrix = matrix.reshape(-1, len(classes))
    index = {c: i for i, c in enumerate(classes)}
    decided = np.array([index.get(str(label), -1) for label in rows["prediction"].tolist()], dtype=np.int64)
    keep = (decided >= 0) & ~np.isnan(matrix).any(axis=1)
    return matrix[keep], decided[keep]


def estimate_window(rows: pd.DataFrame, classes: list[str], holdout: Holdout) -> Estimate | None:
    """The estimate on the window's rows, or None when none of them carries its probabilities."""
    probabilities, decided = served_probabilities(rows, classes)
    if not len(decided):
        return None
    accuracy, error = expected_accuracy(probabilities, decided, holdout.reliability)
    return Estimate(rows=len(decided), accuracy=accuracy, standard_error=error, reference_accuracy=holdout.accuracy,
                    reference_estimate=holdout.estimate, drop=holdout.accuracy - accuracy)
