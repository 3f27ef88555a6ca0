"""One study of `torchship sweep` on one data set and seed, in this process (bench/bench_sweep.py): the splits
prepared once by the prepare stage's core (prepare.seed = train.seed = the seed), then `trials` trials drawn as the
sweep draws them (tasks/sweep/space.py: trial 0 the default configuration, the rest from the sweep's sampler,
multivariate TPE with the constant liar, seeded by the seed), each the train stage's teacher as the torchrun worker
builds it (tables: bench/table_pipeline.py's train_teacher, cross-validated members below train.cv_max_rows; images:
one network with the modality's augmentation), scored as the sweep scores a trial: the out-of-fold figure of
cross-validated members, else the validation split's with the decision rule applied. Only then is the holdout read:
the winner (the best validation score; the sweep's top_k = 1) and the default configuration scored there, paired,
and the baseline cross-validation picks on the training split. What it leaves out: DVC, MLflow, the workers'
processes, pruning (pruner none: every trial trains to its own early stop), export (the torch module's labels, which
the export gates hold the served graph to), and bless's other gates."""
from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tasks.config import parse_params
from tasks.core.metrics import balances_classes, classification_metrics, paired_bootstrap
from tasks.core.params_spec import Params
from tasks.core.runtime import decide
from tasks.sweep import space
from tasks.sweep.study import sampler_for
from tasks.training.loop import Split, predict_logits

RESAMPLES = 1000


@dataclass
class Prepared:
    """A set's splits for one seed: what the search sees (train, val) and what only the judging reads."""

    schema: Any
    train: Split
    val: Split
    holdout: Split
    baseline: dict          # {name, cv_scores, holdout: {metric: value}}
    rows: dict[str, int]


def split_of(inputs: np.ndarray, labels: np.ndarray) -> Split:
    return Split(torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(np.asarray(labels)))


def prepare_table(frame, target: str, source: str, params: Params) -> Prepared:
    """prepare's split and schema, and the baseline the baseline stage's cross-validation picks (its holdout
    figures from the stage's report)."""
    from bench.table_pipeline import cv_baseline
    from bench.table_pipeline import split_of as table_split
    from tasks.modalities.table.baseline import baseline_outputs
    from tasks.modalities.table.prepare import prepare_tables

    prepared = prepare_tables(frame, target, source, params.prepare)
    schema = prepared.schema
    report, _ = baseline_outputs(prepared.train, prepared.holdout, schema, params.baseline, params.bless.metric)
    return Prepared(schema, table_split(prepared.train, schema), table_split(prepared.val, schema),
                    table_split(prepared.holdout, schema), cv_baseline(report, prepared.train, schema, params),
                    {"train": len(prepared.train), "val": len(prepared.val), "holdout": len(prepared.holdout)})


def prepare_images(params: Params) -> Prepared:
    """The image modality's prepare in a scratch folder (it writes the splits as the stage does), the splits read
    back, and the pixel baselines (logistic regression on downsampled pixels, default and class-balanced) picked by
    5-fold cross-validation on the training split."""
    from tasks.core import paths
    from tasks.core.schema_spec import load_schema
    from tasks.modalities import detect_modality
    from tasks.modalities.sources import resolve_target

    modality = detect_modality(params.data, params)
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        modality.prepare(params, resolve_target(params))
        schema = load_schema(paths.SCHEMA)
        splits = {name: modality.read_split(path, schema) for name, path in
                  (("train", paths.TRAIN_SPLIT), ("val", paths.VAL_SPLIT), ("holdout", paths.HOLDOUT_SPLIT))}
    train, holdout = splits["train"], splits["holdout"]
    baseline = pixel_baseline(train.inputs, train.labels, holdout.inputs, holdout.labels, len(schema.classes), params)
    return Prepared(schema, split_of(train.inputs, train.labels), split_of(splits["val"].inputs, splits["val"].labels),
                    split_of(holdout.inputs, holdout.labels), baseline,
                    {name: len(split.labels) for name, split in splits.items()})


def pixel_baseline(train, train_labels, holdout, holdout_labels, n_classes: int, params: Params) -> dict:
    """The pixel baseline 5-fold cross-validation on the training split picks (the bless metric), refitted there and
    scored on the holdout."""
    from sklearn.base import clone
    from sklearn.model_selection import cross_val_score

    from tasks.modalities.image.baseline import MAJORITY, baseline_models, downsampled

    metric = params.bless.metric
    models = {name: model for name, model in baseline_models(params.baseline, balances_classes(metric)).items()
              if name != MAJORITY}
    x, x_holdout = downsampled(train), downsampled(holdout)
    scoring = "f1_macro" if metric == "f1_macro" else "accuracy"
    scores = {name: float(cross_val_score(clone(model), x, train_labels, cv=5, scoring=scoring).mean())
              for name, model in models.items()}
    name = max(scores, key=scores.get)
    labels = np.asarray(clone(models[name]).fit(x, train_labels).predict(x_holdout), dtype=np.int64)
    return {"name": name, "cv_scores": scores, "holdout": classification_metrics(holdout_labels, labels, n_classes)}


def train_images(params: Params, schema, train: Split, val: Split, balanced: bool):
    """(the module, its decision (None: images are multi-class argmax), a summary) as the worker trains one
    network: the fitted schedule, the modality's augmentation, early stopping on validation, then calibration."""
    from models import build_model
    from tasks.modalities import modality_of
    from tasks.training.adapt import fit_training, fitted_settings
    from tasks.training.calibration import calibrate_single
    from tasks.training.loop import STOP_ON_F1, Trainer
    from tasks.training.weights import model_spec

    modality = modality_of(schema)
    fitted = fit_training(params.train, len(train.labels), modality=modality)
    settings = fitted_settings(params.train, fitted)
    torch.manual_seed(settings.seed)
    spec = model_spec(settings)
    layout = modality.fit_layout(train.features.numpy(), schema)
    trainer = Trainer(settings, len(schema.classes), balanced=balanced, stop_on=STOP_ON_F1)
    trainer.augment = modality.augmenter(modality.augmentation(params), settings.seed)
    trainer.setup(build_model(spec["name"], layout, **spec["kwargs"]), train, val)
    state = trainer.train()
    model = build_model(spec["name"], layout, **spec["kwargs"])
    model.load_state_dict(state.best_state)
    model, _, calibration = calibrate_single(model, spec, val.features, val.labels.numpy())
    return model, None, {"fitted": fitted.headline(), "calibration": calibration}


def predicted(model, decision: dict | None, split: Split) -> np.ndarray:
    """The labels the served graph would answer: softmax of the module's logits, then its decision rule."""
    probabilities = torch.softmax(predict_logits(model.eval(), split.features), 1).numpy()
    return decide(probabilities, decision and decision["threshold"])


def trial_score(model, decision, report: dict, val: Split, metric: str, n_classes: int) -> float:
    """What the sweep maximises (tasks/sweep/trial.py validation_score): the out-of-fold figure of cross-validated
    members (their validation figure is in sample), else the validation split's."""
    folds = report.get("cross_validation")
    if folds:
        return float(folds["out_of_fold"][metric])
    return classification_metrics(val.labels.numpy(), predicted(model, decision, val), n_classes)[metric]


def run_study(data: Prepared, raw: dict, seed: int, trials: int, is_image: bool) -> dict:
    """The study on the prepared splits; then the winner and trial 0 (the default configuration) on the holdout."""
    import optuna

    from bench.table_pipeline import train_teacher

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    base = space.with_values(raw, {"prepare.seed": seed, "train.seed": seed})
    params = parse_params(base)
    settings = params.sweep.model_copy(update={"seed": seed, "trials": trials})
    ranges, metric, n_classes = settings.space, params.bless.metric, len(data.schema.classes)
    fits, held = space.enqueued(ranges, space.read_values(base, list(ranges)))
    study = optuna.create_study(direction="maximize", sampler=sampler_for(settings))
    study.enqueue_trial(fits)
    kept: dict[int, tuple] = {}

    def objective(trial) -> float:
        values = space.draw(trial, ranges, held if trial.number == 0 else {})
        trial_params = parse_params(space.with_values(base, values))
        train = train_images if is_image else train_teacher
        started = time.perf_counter()
        model, decision, report = train(trial_params, data.schema, data.train, data.val, balances_classes(metric))
        trial.set_user_attr("seconds", round(time.perf_counter() - started, 1))
        trial.set_user_attr("values", values)
        kept[trial.number] = (model, decision)
        return trial_score(model, decision, report, data.val, metric, n_classes)

    study.optimize(objective, n_trials=trials)
    return judged(study, kept, data, metric, n_classes, seed)


def judged(study, kept: dict, data: Prepared, metric: str, n_classes: int, seed: int) -> dict:
    """The winner and trial 0 on the holdout (read here for the first time), paired, and the baseline's figures."""
    from tasks.sweep.report import ranked

    winner, default = ranked(study.trials)[0], study.trials[0]
    labels = data.holdout.labels.numpy()
    winner_labels, default_labels = (predicted(*kept[t.number], data.holdout) for t in (winner, default))
    scores = {name: classification_metrics(labels, found, n_classes) for name, found in
              (("winner", winner_labels), ("default", default_labels))}
    gain = paired_bootstrap(labels, winner_labels, default_labels, n_classes, metric, RESAMPLES, seed=seed)
    return {"seed": seed, "winner_trial": winner.number, "winner_values": winner.user_attrs["values"],
            "winner_validation": winner.value, "default_validation": default.value,
            "winner": scores["winner"], "default": scores["default"], "gain": gain,
            "optimism": winner.value - scores["winner"][metric],
            "baseline": {"name": data.baseline["name"], **{k: data.baseline["holdout"][k]
                                                           for k in ("accuracy", "f1_macro")}},
            "trial_seconds": [t.user_attrs.get("seconds") for t in study.trials],
            "validation_scores": [t.value for t in study.trials], "rows": data.rows, "classes": n_classes}
