"""What a few lines of scikit-learn reach on the same image splits: the majority class, a logistic regression on
downsampled pixels, and with a pretrained backbone a linear probe on its frozen features (what a fine-tune must
beat: if training the network does not beat a linear classifier on the features it started from, the fine-tune
did not pay). Pure: pixels and labels in, scores and holdout predictions out."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tasks.core import paths
from tasks.core.labels import encode_target
from tasks.core.metrics import balances_classes, best_baseline, classification_metrics
from tasks.core.params_spec import BaselineParams
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import image_shape
from tasks.modalities.image.shards import read_metadata, read_pixels

MAJORITY, PIXELS, PROBE = "majority_class", "logistic_regression_pixels", "linear_probe"
BALANCED = "_balanced"
SMALL_SIDE = 16   # pixels are averaged down to at most this side before the logistic regression


def downsampled(pixels: np.ndarray, side: int = SMALL_SIDE) -> np.ndarray:
    """(N, H, W, C) uint8 -> (N, h*w*C) float32 in 0..1, each side averaged down by the largest whole factor that
    brings it to at most `side` (an 8x8 digit stays 8x8; 32x32 becomes 16x16)."""
    n, height, width, channels = pixels.shape
    fh, fw = -(-height // side), -(-width // side)
    h, w = height // fh, width // fw
    cropped = pixels[:, :h * fh, :w * fw].astype(np.float32) / 255.0
    return cropped.reshape(n, h, fh, w, fw, channels).mean(axis=(2, 4)).reshape(n, -1)


def baseline_models(rules: BaselineParams, add_balanced: bool) -> dict:
    """{name: unfitted model} on downsampled pixels (or a probe's features)."""
    from sklearn.dummy import DummyClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    models = {MAJORITY: DummyClassifier(strategy="most_frequent")}
    for suffix, weights in ({"": None, BALANCED: "balanced"} if add_balanced else {"": None}).items():
        models[PIXELS + suffix] = make_pipeline(StandardScaler(), LogisticRegression(
            C=rules.logistic_c, max_iter=rules.logistic_max_iter, class_weight=weights))
    return models


def fit_and_predict(train: np.ndarray, train_labels: np.ndarray, holdout: np.ndarray, holdout_labels: np.ndarray,
                    n_classes: int, rules: BaselineParams, add_balanced: bool,
                    features: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]:
    """({name: {accuracy, f1_macro, fit_seconds}} on the holdout, {name: (N,) predicted class indices}); with
    `features` (pixels -> a frozen backbone's embeddings), the linear probe on them too."""
    inputs = {"pixels": (downsampled(train), downsampled(holdout))}
    if features is not None:
        inputs["probe"] = (features(train), features(holdout))
    results, predictions = {}, {}
    for name, model in baseline_models(rules, add_balanced).items():
        _fit_one(name, model, *inputs["pixels"], train_labels, holdout_labels, n_classes, results, predictions)
    if features is not None:
        from sklearn.base import clone

        for suffix in ("", BALANCED) if add_balanced else ("",):
            model = clone(baseline_models(rules, add_balanced)[PIXELS + suffix])
            _fit_one(PROBE + suffix, model, *inputs["probe"], train_labels, holdout_labels, n_classes, results,
                     predictions)
    return results, predictions


def _fit_one(name: str, model, train: np.ndarray, holdout: np.ndarray, train_labels: np.ndarray,
             holdout_labels: np.ndarray, n_classes: int, results: dict, predictions: dict) -> None:
    started = time.perf_counter()
    model.fit(train, train_labels)
    predictions[name] = np.asarray(model.predict(holdout), dtype=np.int64)
    results[name] = {**classification_metrics(holdout_labels, predictions[name], n_classes),
                     "fit_seconds": round(time.perf_counter() - started, 3)}


def gate_baseline(results: dict[str, dict[str, float]], metric: str) -> str:
    """The baseline bless holds the candidate to: its own linear probe when there is one (a fine-tune must beat
    the features it started from), else the best on the holdout."""
    probes = [name for name in results if name.startswith(PROBE)]
    pool = probes or list(results)
    return max(pool, key=lambda name: results[name][metric])


def baseline_outputs(params, schema: Schema, backbone: Callable | None = None) -> tuple[dict, dict]:
    """The image baselines on the prepared splits, in the baseline report's shape: the majority class, a logistic
    regression on downsampled pixels, and with a `backbone` (train pixels -> a frozen pretrained backbone's features
    function) a linear probe on its features, which is then the gate's baseline."""
    metric, shape = params.bless.metric, image_shape(schema).shape
    train, holdout = read_pixels(paths.TRAIN_SPLIT, shape), read_pixels(paths.HOLDOUT_SPLIT, shape)
    labels = [encode_target(read_metadata(path, schema.target)["label"], schema)
              for path in (paths.TRAIN_SPLIT, paths.HOLDOUT_SPLIT)]
    features = backbone(train) if backbone is not None else None
    models, predicted = fit_and_predict(train, labels[0], holdout, labels[1], len(schema.classes),
                                               params.baseline, balances_classes(metric), features)
    gate = gate_baseline(models, metric)
    best, score = best_baseline({"models": models}, metric)
    report = {"metric": metric, "modality": "image", "models": models, "picked": None, "cv_scores": None,
              "class_weights": ["none", "balanced"] if balances_classes(metric) else ["none"], "gate": gate,
              "headline": f"best {best.replace('_', ' ')} {metric} {score:.4f}; " + ", ".join(
                  f"{name.replace('_', ' ')} {figures[metric]:.4f}" for name, figures in models.items()
                  if name != best) + (f"; the gate's: {gate.replace('_', ' ')}" if gate != best else "")}
    return report, {"baseline": gate, "metric": metric, "rows": len(holdout), "predicted": predicted[gate].tolist()}
