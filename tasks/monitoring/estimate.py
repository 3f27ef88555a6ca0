"""A label-free estimate of accuracy (confidence-based, as NannyML's CBPE): for calibrated probabilities, the
chance a served answer is right is the probability the model gave the class it answered, so the expected
accuracy of a window is the mean of those probabilities. It reads only what the service logged (its
probabilities and its answer, tasks/core/servelog.py), so it needs no label.

It holds while P(y|x) stays what the model learned (covariate shift: the inputs move, the labelling does not)
and the probabilities are calibrated (tasks/training/calibration.py tempers them at training when they are not).
Under concept shift it is blind: the model is as confident as before and wrong more often
(docs/closed-loop.md, bench/results/estimate.json)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel

PROBABILITIES = "probabilities"   # the window's column of logged {class: probability}


class Holdout(BaseModel):
    """The serving version on the holdout, scored now: what the window's figures are held to."""

    accuracy: float
    estimate: float               # the estimate on the same rows: how far calibration is off, where labels exist


class Estimate(BaseModel):
    rows: int                     # window rows with logged probabilities the estimate averages
    accuracy: float               # the expected accuracy
    standard_error: float         # how far the realised accuracy of these rows may fall from it (one sd)
    reference_accuracy: float     # the holdout's accuracy
    reference_estimate: float     # the estimate on the holdout
    drop: float                   # reference_accuracy - accuracy


def expected_accuracy(probabilities: np.ndarray, decided: np.ndarray) -> tuple[float, float]:
    """(expected accuracy, its standard error) of (N, C) probabilities whose served classes are (N,) `decided`:
    each row is right with probability p = its probability of the served class (a Bernoulli), so the realised
    accuracy has mean mean(p) and standard deviation sqrt(sum p (1 - p)) / N."""
    right = probabilities[np.arange(len(decided)), decided]
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
    accuracy, error = expected_accuracy(probabilities, decided)
    return Estimate(rows=len(decided), accuracy=accuracy, standard_error=error, reference_accuracy=holdout.accuracy,
                    reference_estimate=holdout.estimate, drop=holdout.accuracy - accuracy)
