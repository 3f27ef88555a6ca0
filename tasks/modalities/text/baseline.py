"""What a few lines of scikit-learn reach on the same text splits: the majority class, and TF-IDF (word 1-2 grams
and character 2-5 grams within word boundaries, sublinear term frequency) + logistic regression, the baseline text
practitioners reach for first; with `add_balanced`, the logistic regression with class-balanced weights too; and
with a pretrained text encoder, a linear probe on its frozen features, which is then the gate's baseline (a fine-tune
must beat the features it started from). Pure: texts (and features) and labels in, scores and holdout predictions
out."""
from __future__ import annotations

import time

import numpy as np

from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import BaselineParams

MAJORITY, TFIDF, PROBE = "majority_class", "tfidf_logistic_regression", "linear_probe"
BALANCED = "_balanced"
MAX_FEATURES = 200_000   # word and character n-grams together: the most frequent kept, half each
MIN_DF = 2               # an n-gram seen in one training text only says nothing about a class


def text_features(max_features: int = MAX_FEATURES):
    """The unfitted TF-IDF union: word 1-2 grams and character 2-5 grams (`char_wb`), sublinear tf, each block
    L2-normalised and capped at half of `max_features`."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_union

    half = max(1, max_features // 2)
    return make_union(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=MIN_DF, max_features=half),
                      TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=MIN_DF,
                                      max_features=half))


def logistic(rules: BaselineParams, weights: str | None):
    """The logistic regression on TF-IDF: newton-cg, which converges in a few steps on sparse n-grams (lbfgs took
    3.5x as long on 30k tweets, for the same macro-F1)."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=rules.logistic_c, max_iter=rules.logistic_max_iter, class_weight=weights,
                              solver="newton-cg")


def _weightings(add_balanced: bool) -> dict[str, str | None]:
    """{name suffix: class_weight} of each logistic regression fitted."""
    return {"": None, BALANCED: "balanced"} if add_balanced else {"": None}


def _linear_probe(rules: BaselineParams, weights: str | None):
    """The linear probe: a logistic regression on the standardised frozen features (dense, a few hundred wide)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=rules.logistic_c, max_iter=rules.logistic_max_iter,
                                                              class_weight=weights))


def fit_and_predict(train: list[str], train_labels: np.ndarray, holdout: list[str], holdout_labels: np.ndarray,
                    n_classes: int, rules: BaselineParams, add_balanced: bool, max_features: int = MAX_FEATURES,
                    probe: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]:
    """({name: {accuracy, f1_macro, fit_seconds}} on the holdout, {name: (N,) predicted class indices}). The TF-IDF
    features are fitted once on the training texts; each model's fit_seconds includes that fit. With `probe` (the
    frozen encoder's features of the training and holdout texts), the linear probe on them too."""
    from sklearn.dummy import DummyClassifier

    results, predictions = {}, {}
    _fit_one(MAJORITY, DummyClassifier(strategy="most_frequent"), np.zeros((len(train), 1)),
             np.zeros((len(holdout), 1)), train_labels, holdout_labels, n_classes, 0.0, results, predictions)
    started = time.perf_counter()
    features = text_features(max_features)
    train_features = features.fit_transform(train)
    holdout_features = features.transform(holdout)
    vectorised = time.perf_counter() - started
    for suffix, weights in _weightings(add_balanced).items():
        _fit_one(TFIDF + suffix, logistic(rules, weights), train_features, holdout_features, train_labels,
                 holdout_labels, n_classes, vectorised, results, predictions)
    for suffix, weights in _weightings(add_balanced).items() if probe is not None else ():
        _fit_one(PROBE + suffix, _linear_probe(rules, weights), *probe, train_labels, holdout_labels, n_classes, 0.0,
                 results, predictions)
    return results, predictions


def _fit_one(name: str, model, train, holdout, train_labels: np.ndarray, holdout_labels: np.ndarray,
             n_classes: int, spent: float, results: dict, predictions: dict) -> None:
    started = time.perf_counter()
    model.fit(train, train_labels)
    predictions[name] = np.asarray(model.predict(holdout), dtype=np.int64)
    results[name] = {**classification_metrics(holdout_labels, predictions[name], n_classes),
                     "fit_seconds": round(spent + time.perf_counter() - started, 3)}


def gate_baseline(results: dict[str, dict[str, float]], metric: str) -> str:
    """The baseline bless holds the candidate to: the linear probe on a pretrained encoder's features when there is
    one (a fine-tune must beat the features it started from), else the best on the holdout (TF-IDF, unless the
    majority class wins on a degenerate set)."""
    pool = [name for name in results if name.startswith(PROBE)] or list(results)
    return max(pool, key=lambda name: results[name][metric])


def baseline_report(train: list[str], train_labels: np.ndarray, holdout: list[str], holdout_labels: np.ndarray,
                    classes: list[str], rules: BaselineParams, metric: str,
                    probe: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[dict, dict]:
    """(the baseline report: {metric, models, gate, headline, ...}, the gate's holdout predictions) of the majority
    class and TF-IDF + logistic regression (class-balanced too where the metric rewards it), and with `probe` the
    linear probe on a pretrained encoder's frozen features, the gate's baseline."""
    from tasks.core.metrics import balances_classes, best_baseline

    models, predicted = fit_and_predict(train, train_labels, holdout, holdout_labels, len(classes), rules,
                                        balances_classes(metric), probe=probe)
    gate = gate_baseline(models, metric)
    best, score = best_baseline({"models": models}, metric)
    report = {"metric": metric, "modality": "text", "models": models, "picked": None, "cv_scores": None,
              "class_weights": ["none", "balanced"] if balances_classes(metric) else ["none"], "gate": gate,
              "headline": f"best {best.replace('_', ' ')} {metric} {score:.4f}; " + ", ".join(
                  f"{name.replace('_', ' ')} {figures[metric]:.4f}" for name, figures in models.items()
                  if name != best) + (f"; the gate's: {gate.replace('_', ' ')}" if gate != best else "")}
    return report, {"baseline": gate, "metric": metric, "rows": len(holdout), "predicted": predicted[gate].tolist()}
