"""The table baselines: what a few lines of scikit-learn reach on the same splits. A regularised logistic regression
(imputed, standardised numbers, one-hot categories) and a histogram gradient-boosting classifier (native missing
values and categories), fit on the training split and scored on the holdout. When the bless metric is macro-F1 each
also runs class-balanced, as training weights its loss then. Below baseline.cv_max_rows training rows the gate
compares with the one of them that k-fold cross-validation on the training split picks, as a user without the
holdout would (like with like: the candidate's own family is picked out of fold too); from there on, with the best
of all on the holdout. Pure: frames in, the report and the gate's holdout predictions out."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from tasks.core.labels import encode_target
from tasks.core.metrics import balances_classes, best_baseline, classification_metrics
from tasks.core.params_spec import BaselineParams
from tasks.core.schema_spec import Schema
from tasks.modalities.table.encoding import encode_features

BALANCED = "_balanced"   # suffix of a class-balanced baseline's name


def baseline_models(schema: Schema, rules: BaselineParams, add_balanced: bool) -> dict:
    """{name: unfitted model}: the defaults, and with `add_balanced` each again with class_weight="balanced"."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    categorical = [i for i, f in enumerate(schema.features) if f.kind == "categorical"]
    numeric = [i for i, f in enumerate(schema.features) if f.kind == "numeric"]
    weightings = {"": None, BALANCED: "balanced"} if add_balanced else {"": None}   # name suffix -> class_weight
    models = {}
    for suffix, weights in weightings.items():
        models[f"logistic_regression{suffix}"] = make_pipeline(
            ColumnTransformer([("numeric", make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True),
                                                         StandardScaler()), numeric),
                               ("categorical", OneHotEncoder(handle_unknown="ignore"), categorical)]),
            LogisticRegression(C=rules.logistic_c, max_iter=rules.logistic_max_iter, class_weight=weights))
        models[f"hist_gradient_boosting{suffix}"] = HistGradientBoostingClassifier(
            categorical_features=categorical or None, max_iter=rules.boosting_max_iter, class_weight=weights,
            random_state=rules.seed)
    return models


def fit_baselines(train: pd.DataFrame, holdout: pd.DataFrame, schema: Schema, rules: BaselineParams,
                  add_balanced: bool) -> dict[str, dict[str, float]]:
    """Pure core: {model: {accuracy, f1_macro, fit_seconds}} on the holdout."""
    return fit_and_predict(train, holdout, schema, rules, add_balanced)[0]


def fit_and_predict(train: pd.DataFrame, holdout: pd.DataFrame, schema: Schema, rules: BaselineParams,
                    add_balanced: bool) -> tuple[dict[str, dict[str, float]], dict[str, np.ndarray]]:
    """Pure core: ({model: {accuracy, f1_macro, fit_seconds}} on the holdout, {model: (N,) predicted class
    indices}), features encoded as the model's are (numbers as-is with NaN for missing, categories as codes with
    0 = unknown)."""
    features, holdout_features = encode_features(train, schema), encode_features(holdout, schema)
    labels, holdout_labels = encode_target(train[schema.target], schema), encode_target(holdout[schema.target], schema)
    results, predictions = {}, {}
    for name, model in baseline_models(schema, rules, add_balanced).items():
        started = time.perf_counter()
        model.fit(features, labels)
        predictions[name] = np.asarray(model.predict(holdout_features), dtype=np.int64)
        results[name] = {**classification_metrics(holdout_labels, predictions[name], len(schema.classes)),
                         "fit_seconds": round(time.perf_counter() - started, 3)}
    return results, predictions


def pick_baseline(train: pd.DataFrame, schema: Schema, rules: BaselineParams, metric: str,
                  add_balanced: bool) -> tuple[str, dict[str, float]]:
    """(the baseline with the best `rules.cv_folds`-fold cross-validated `metric` on the training split, every
    baseline's cross-validated score): the holdout never takes part in the choice."""
    from sklearn.base import clone
    from sklearn.model_selection import StratifiedKFold

    features, labels = encode_features(train, schema), encode_target(train[schema.target], schema)
    folds = StratifiedKFold(rules.cv_folds, shuffle=True, random_state=rules.seed)
    scores = {}
    for name, model in baseline_models(schema, rules, add_balanced).items():
        predicted = np.empty_like(labels)
        for fit_rows, scored_rows in folds.split(features, labels):
            predicted[scored_rows] = clone(model).fit(features[fit_rows], labels[fit_rows]).predict(
                features[scored_rows])
        scores[name] = classification_metrics(labels, predicted, len(schema.classes))[metric]
    return max(scores, key=scores.get), scores   # a tie goes to the earlier (default, then linear) one


def baseline_report(train: pd.DataFrame, holdout: pd.DataFrame, schema: Schema, rules: BaselineParams,
                    metric: str) -> dict:
    """The stage's report alone (see baseline_outputs)."""
    return baseline_outputs(train, holdout, schema, rules, metric)[0]


def baseline_outputs(train: pd.DataFrame, holdout: pd.DataFrame, schema: Schema, rules: BaselineParams,
                     metric: str) -> tuple[dict, dict]:
    """Pure core of the stage: (report, the gate's predictions). The report: {metric, class_weights, models, picked,
    cv_scores, gate, headline}; under macro-F1 (the bless `metric`) the default and the class-balanced baselines
    both. `picked`: the one cross-validation picks below `rules.cv_max_rows` training rows (None above: the gate
    then takes the best on the holdout); `gate`: the one the gate holds the candidate to. The gate's predictions:
    {baseline, metric, rows, predicted: that baseline's holdout class indices, in the holdout's row order}."""
    balanced = balances_classes(metric)
    models, predicted = fit_and_predict(train, holdout, schema, rules, add_balanced=balanced)
    report = {"metric": metric, "class_weights": ["none", "balanced"] if balanced else ["none"], "models": models,
              "picked": None, "cv_scores": None}
    if len(train) < rules.cv_max_rows:
        report["picked"], report["cv_scores"] = pick_baseline(train, schema, rules, metric, balanced)
    best, score = best_baseline(report, metric)
    report["gate"] = report["picked"] or best
    report["headline"] = f"best {best.replace('_', ' ')} {metric} {score:.4f}; " + ", ".join(
        f"{name.replace('_', ' ')} {figures[metric]:.4f}" for name, figures in models.items() if name != best)
    if report["picked"]:
        report["headline"] += (f"; the gate's, picked by {rules.cv_folds}-fold cross-validation on the training "
                               f"split: {report['picked'].replace('_', ' ')} "
                               f"{models[report['picked']][metric]:.4f}")
    gate = report["gate"]
    return report, {"baseline": gate, "metric": metric, "rows": len(holdout),
                    "predicted": predicted[gate].tolist()}
