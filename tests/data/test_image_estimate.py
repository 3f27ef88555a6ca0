"""The label-free accuracy estimate (tasks/monitoring/estimate.py) on a ten-class image model's logged probabilities,
the way the monitor reaches it (tasks/monitor.py): the serving version scores the holdout for the reliability
curves, the served rows are read back from a request log in the service's own line format (image statistics and
embedding, probabilities rounded as logged), and tasks/monitoring/drift.py measure_drift reports the estimate.

The "model" is pixel logistic regression on scikit-learn's 8x8 digits (real images, ten classes), its confidence
tempered on a validation split as the train stage does (tasks/training/calibration.py). The window's labels are
known to the test, never to the monitor: the estimate must land within 3 points of the realised accuracy, on clean
traffic and on a covariate shift (the dimmer half of the images: P(x) moves, the labelling does not)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from serving.service import EMBEDDING_DIGITS, PROBABILITY_DIGITS
from tasks.core.params_spec import MonitorParams
from tasks.core.runtime import decide
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.core.servelog import served_line
from tasks.modalities.image.decode import encode_png
from tasks.modalities.image.sources import packaged_digits
from tasks.core.runtime import EMBEDDING
from tasks.modalities.image.watch import STATISTICS
from tasks.monitoring.drift import measure_drift
from tasks.core.servelog import PREDICTION
from tasks.monitoring.estimate import Holdout, expected_accuracy, fit_reliability
from tasks.monitoring.window import read_window
from tasks.training.calibration import calibrate, tempered

CLASSES = [str(d) for d in range(10)]
SCHEMA = Schema(source="images:digits", target="label", classes=CLASSES, modality="image",
                inputs=ImageShape(height=8, width=8, channels=1, mode="L").model_dump())
RULES = MonitorParams(sample_rows=1000, min_labelled=50)
TOLERANCE = 0.03


class DigitsModel:
    """Tempered pixel logistic regression and a fixed random projection of the pixels as its 'embedding'."""

    def __init__(self, pixels: np.ndarray, labels: np.ndarray, val_pixels: np.ndarray, val_labels: np.ndarray):
        from sklearn.linear_model import LogisticRegression

        self.fit = LogisticRegression(C=1.0, max_iter=500).fit(self.flat(pixels), labels)
        self.temperature = calibrate(self.fit.predict_log_proba(self.flat(val_pixels)), val_labels)["temperature"]
        self.projection = np.random.default_rng(0).normal(size=(64, 8)) / 8

    @staticmethod
    def flat(pixels: np.ndarray) -> np.ndarray:
        return pixels.reshape(len(pixels), -1) / 255.0

    def probabilities(self, pixels: np.ndarray) -> np.ndarray:
        return tempered(self.fit.predict_log_proba(self.flat(pixels)), self.temperature)

    def embedding(self, pixels: np.ndarray) -> np.ndarray:
        return self.flat(pixels) @ self.projection


@pytest.fixture(scope="module")
def digits():
    """(model, {split: (pixels, label indices)}): train, val, holdout and the served stream, shuffled once."""
    pixels, labels = packaged_digits()
    y = np.array([int(v) for v in labels])
    order = np.random.default_rng(0).permutation(len(y))
    cuts = {"train": order[:600], "val": order[600:900], "holdout": order[900:1350], "served": order[1350:]}
    splits = {name: (pixels[index], y[index]) for name, index in cuts.items()}
    return DigitsModel(*splits["train"], *splits["val"]), splits


def holdout_scores(model: DigitsModel, pixels: np.ndarray, labels: np.ndarray) -> Holdout:
    """What tasks/monitor.py holdout_scores builds from the serving version's answers on the holdout."""
    probabilities = model.probabilities(pixels)
    decided = decide(probabilities)
    return Holdout(accuracy=float((decided == labels).mean()), estimate=expected_accuracy(probabilities, decided)[0],
                   reliability=fit_reliability(probabilities, decided, labels))


def statistics(image: np.ndarray) -> dict:
    return {"width": 8, "height": 8, "mode": "L", "file_bytes": len(encode_png(image)),
            "brightness": float(image.mean()), "contrast": float(image.std())}


def log_served(path, model: DigitsModel, pixels: np.ndarray) -> None:
    """The request log the image service writes for these images (serving/service.py _served_lines' format)."""
    probabilities = np.round(model.probabilities(pixels), PROBABILITY_DIGITS)
    embedding = np.round(model.embedding(pixels), EMBEDDING_DIGITS)
    decided = decide(probabilities)
    with path.open("w") as log:
        for i, image in enumerate(pixels):
            # the logged dict in reverse class order: the estimate reads probabilities by class name, not position
            logged = {c: float(probabilities[i, k]) for k, c in reversed(list(enumerate(CLASSES)))}
            log.write(served_line(f"r{i}", 0, "champion", "1", {**statistics(image), EMBEDDING: embedding[i].tolist()},
                                  CLASSES[decided[i]], logged))


def reference(model: DigitsModel, pixels: np.ndarray) -> pd.DataFrame:
    """The monitor's image reference (tasks/monitor.py image_reference): statistics, embeddings and answers."""
    frame = pd.DataFrame([statistics(image) for image in pixels])[list(STATISTICS)]
    answers = decide(model.probabilities(pixels))
    return frame.assign(**{EMBEDDING: list(model.embedding(pixels)), PREDICTION: [CLASSES[i] for i in answers]})


@pytest.mark.parametrize("stream", ["clean", "dimmer half"])
def test_the_estimate_follows_an_image_models_realised_accuracy(digits, tmp_path, stream):
    model, splits = digits
    pixels, labels = splits["served"]
    if stream == "dimmer half":   # selected by the pixels alone: a covariate shift
        dim = np.argsort(pixels.reshape(len(pixels), -1).mean(1))[: len(pixels) // 2]
        pixels, labels = pixels[dim], labels[dim]
    log_served(tmp_path / "requests.jsonl", model, pixels)
    window = read_window(tmp_path / "requests.jsonl", RULES)
    holdout = holdout_scores(model, *splits["holdout"])
    findings, _ = measure_drift(reference(model, splits["val"][0]), window.rows, SCHEMA, RULES, holdout)
    estimate = findings.estimate
    realised = float((decide(model.probabilities(pixels)) == labels).mean())
    assert estimate is not None and estimate.rows == len(pixels)
    assert abs(estimate.accuracy - realised) < TOLERANCE, (estimate, realised)
    assert estimate.reference_accuracy == holdout.accuracy
    assert abs(estimate.drop - (holdout.accuracy - realised)) < TOLERANCE
    assert estimate.drop < RULES.max_estimated_drop   # no false alarm: the accuracy did not fall
    assert 0 < estimate.standard_error < 0.02


def test_rows_logged_without_probabilities_or_with_an_unknown_answer_are_left_out(digits, tmp_path):
    model, splits = digits
    pixels, _ = splits["served"]
    log_served(tmp_path / "requests.jsonl", model, pixels[:200])
    window = read_window(tmp_path / "requests.jsonl", RULES)
    rows = window.rows.copy()
    rows.loc[0, "probabilities"] = None
    rows.loc[1, PREDICTION] = "eleven"
    findings, _ = measure_drift(reference(model, splits["val"][0]), rows, SCHEMA, RULES,
                                holdout_scores(model, *splits["holdout"]))
    assert findings.estimate.rows == 198
