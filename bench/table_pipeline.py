"""One table and seed through the cores of the stages that decide what is served, in this process: prepare's split,
the baseline stage's report, the train stage's teacher (cross-validated members, family, temperature, threshold:
the calls the torchrun worker makes, with the plain single-process Trainer instead of the checkpointing one), the
export stage's ONNX file (threshold in its metadata), the holdout labels bless reads from that file, and bless's
quality rule against the baselines for a first model (the paired bootstrap of the gap to the baseline stage's saved
predictions). What it leaves out: DVC, MLflow, torchrun, checkpoints,
compress/profile (a student or int8 variant is served only within bless.max_drop of this file's metric) and the
latency gate. Used by bench/bench_tables.py."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from models import build_model
from tasks.bless import predict_labels
from tasks.bless.quality import HoldoutPredictions, baseline_gap, gate_baselines, gate_predictions, judge_candidate
from tasks.core.labels import encode_target
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import Params, TrainParams
from tasks.core.schema_spec import Schema
from tasks.modalities.table.baseline import baseline_outputs
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.layout import fit_layout
from tasks.modalities.table.prepare import prepare_tables
from tasks.training.adapt import fit_training, fitted_settings
from tasks.training.calibration import calibrate_single
from tasks.training.crossval import candidates_for, cross_validate, cross_validation_rows, finish_cross_validation
from tasks.training.job import validation_decision
from tasks.training.loop import STOP_ON_F1, Split, Trainer, predict_logits
from tasks.training.weights import model_spec
from tasks.variants.exporters import export_onnx


def split_of(frame: pd.DataFrame, schema: Schema) -> Split:
    return Split(torch.from_numpy(encode_features(frame, schema)),
                 torch.from_numpy(encode_target(frame[schema.target], schema)))


def plain_starter(n_classes: int, balanced: bool):
    """The train stage's fold starter without torchrun or checkpoints: the same Trainer, loss and schedule."""
    def start(settings: TrainParams, tag: str, model, train: Split, val: Split, stop_on: str = STOP_ON_F1) -> Trainer:
        trainer = Trainer(settings, n_classes, balanced=balanced, stop_on=stop_on)
        trainer.setup(model, train, val)
        return trainer

    return start


def train_teacher(params: Params, schema: Schema, train: Split, val: Split, balanced: bool):
    """(the served module, its decision threshold or None, the train report's summary) as the worker makes them."""
    n_classes = len(schema.classes)
    fitted = fit_training(params.train, len(train.labels))
    settings = fitted_settings(params.train, fitted)
    torch.manual_seed(settings.seed)
    start = plain_starter(n_classes, balanced)
    if fitted.folds > 1:   # as the worker: the members train on the validation rows too
        train = cross_validation_rows(train, val)
    layout = fit_layout(train.features.numpy(), schema)
    if fitted.folds > 1:
        chosen, runs = cross_validate(candidates_for(settings, fitted), train, layout, n_classes, fitted.folds,
                                      settings.seed, start)
        best, _, fitted, summary = finish_cross_validation(chosen, runs, layout, fitted, train.labels.numpy(),
                                                           params.bless.metric, balanced)
        return best, summary["decision"], {"fitted": fitted.headline(), "cross_validation": summary}
    spec = model_spec(settings)
    trainer = start(settings, "", build_model(spec["name"], layout, **spec["kwargs"]), train, val)
    state = trainer.train()
    model = build_model(spec["name"], layout, **spec["kwargs"])
    model.load_state_dict(state.best_state)
    model, _, calibration = calibrate_single(model, spec, val.features, val.labels.numpy())
    decision = validation_decision(predict_logits(model, val.features), val, params.bless.metric)
    return model, decision, {"fitted": fitted.headline(), "calibration": calibration, "decision": decision}


def cv_baseline(baselines: dict, train: pd.DataFrame, schema: Schema, params: Params) -> dict:
    """The baseline the goal compares with: the one baseline.cv_folds-fold cross-validation on the training split
    picks on the bless metric (the baseline stage's own pick below baseline.cv_max_rows, the same rule above it),
    with its holdout figures from the stage's report."""
    from tasks.core.metrics import balances_classes
    from tasks.modalities.table.baseline import pick_baseline

    name, scores = baselines["picked"], baselines["cv_scores"]
    if name is None:
        name, scores = pick_baseline(train, schema, params.baseline, params.bless.metric,
                                     balances_classes(params.bless.metric))
    return {"name": name, "cv_scores": scores, "holdout": baselines["models"][name]}


def run_table(frame: pd.DataFrame, target: str, source: str, params: Params, seed: int, threads: int,
              balanced: bool | None = None, with_cv_baseline: bool = True) -> dict:
    """One seed (prepare.seed = train.seed = `seed`): the served file's holdout scores and labels, the baselines
    (the stage's four on the holdout, and the one cross-validation picks), bless's verdict, train seconds."""
    from tasks.core.metrics import balances_classes

    params = params.model_copy(update={"prepare": params.prepare.model_copy(update={"seed": seed}),
                                       "train": params.train.model_copy(update={"seed": seed})})
    torch.set_num_threads(threads)
    prepared = prepare_tables(frame, target, source, params.prepare)
    schema = prepared.schema
    train, val = split_of(prepared.train, schema), split_of(prepared.val, schema)
    started = time.perf_counter()
    model, decision, report = train_teacher(params, schema, train, val,
                                            balances_classes(params.bless.metric) if balanced is None else balanced)
    train_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "model.onnx"
        export_onnx(model.eval(), schema, params.export.onnx_exporter, path, decision and decision["threshold"])
        served_labels = predict_labels(path, schema, prepared.holdout, threads)
    holdout_labels = encode_target(prepared.holdout[schema.target], schema)
    served = classification_metrics(holdout_labels, served_labels, len(schema.classes))
    baselines, saved = baseline_outputs(prepared.train, prepared.holdout, schema, params.baseline,
                                        params.bless.metric)
    gate = gate_baselines(baselines)
    predictions = HoldoutPredictions(prepared.holdout, holdout_labels, served_labels, None, schema.classes,
                                     gate_predictions(saved, gate, params.bless.metric, len(holdout_labels)))
    gap = baseline_gap(predictions, params.bless)
    verdict = judge_candidate(served, None, True, params.bless, baselines=gate, gap=gap)
    return {"seed": seed, "served": served, "served_labels": served_labels, "holdout_labels": holdout_labels,
            "baselines": {name: {m: figures[m] for m in ("accuracy", "f1_macro")}
                          for name, figures in baselines["models"].items()},
            "cv_baseline": cv_baseline(baselines, prepared.train, schema, params) if with_cv_baseline else None,
            "bless": verdict.gate.status, "bless_reasons": verdict.gate.reasons, "bless_gap": gap, "train_s": train_s,
            "rows": {"train": len(prepared.train), "val": len(prepared.val), "holdout": len(prepared.holdout)},
            "classes": len(schema.classes), "report": report}
