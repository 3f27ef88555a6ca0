"""The winner's curse, caught, in process: a study on noise labels (no signal) picks its winner by validation score,
which then looks good; bless re-judges it on the holdout the search never read, against the live champion (the
study's trial 0: the champion's configuration), and `sweep.require_better` refuses it, since it is not shown better.

The study is the sweep's own (tasks/sweep/space.py draws each trial's values, tasks/sweep/study.py's sampler,
tasks/sweep/report.py ranks and accepts); each trial is the train stage's single-process core (train_model) on
prepare's splits (tasks/modalities/table/prepare.py), and bless's quality core (assess_quality) judges the holdout.
A tiny MLP on 1,000 rows, accuracy on balanced labels: the search varies the learning rate and the training seed,
which on noise can only find luck."""
from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import torch

from models import build_model
from tasks.bless.quality import HoldoutPredictions, assess_quality
from tasks.config import parse_params
from tasks.core.labels import encode_target
from tasks.core.metrics import classification_metrics
from tasks.core.runtime import decide
from tasks.core.verdicts import Blessing
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.layout import fit_layout
from tasks.modalities.table.prepare import prepare_tables
from tasks.sweep import space
from tasks.sweep.report import Finalist, accepts, ranked
from tasks.sweep.study import sampler_for
from tasks.training.loop import Split, predict_logits, train_model
from tasks.training.weights import model_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)
TRIALS, TOP_K = 12, 3
RAW = {"prepare": {"val_fraction": 0.1, "holdout_fraction": 0.4},
       "train": {"model": "mlp", "adapt": False, "epochs": 6, "batch_size": 64, "patience": 6, "threads": 1,
                 "cv_max_rows": 0, "model_args": {"mlp": {"hidden": [16]}}},
       "bless": {"metric": "accuracy", "bootstrap": 300},
       "sweep": {"trials": TRIALS, "seed": 3, "space": {"train.lr": {"low": 0.001, "high": 0.03, "log": True},
                                                        "train.seed": {"low": 0, "high": 1000}}}}


def noise_table(rows: int = 1000, seed: int = 6) -> pd.DataFrame:
    """Five numeric columns and a balanced label drawn independently of them: nothing to learn."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(rows, 5)), columns=[f"x{i}" for i in range(5)])
    return frame.assign(label=rng.permutation(np.repeat(["no", "yes"], rows // 2)))


def split_of(frame: pd.DataFrame, schema) -> Split:
    return Split(torch.from_numpy(encode_features(frame, schema)),
                 torch.from_numpy(encode_target(frame[schema.target], schema)))


def labels_of(model, split: Split) -> np.ndarray:
    return decide(torch.softmax(predict_logits(model, split.features), 1).numpy())


def test_a_winner_picked_on_noise_looks_good_on_validation_and_bless_refuses_it_on_the_holdout():
    torch.set_num_threads(1)
    params = parse_params(RAW)
    prepared = prepare_tables(noise_table(), "label", "noise.csv", params.prepare)
    schema, metric = prepared.schema, params.bless.metric
    train, val, holdout = (split_of(frame, schema) for frame in (prepared.train, prepared.val, prepared.holdout))
    layout = fit_layout(train.features.numpy(), schema)
    ranges = params.sweep.space
    fits, held = space.enqueued(ranges, space.read_values(RAW, list(ranges)))
    study = optuna.create_study(direction="maximize", sampler=sampler_for(params.sweep))
    study.enqueue_trial(fits)   # trial 0: the configuration the live champion was trained with
    models = {}

    def objective(trial) -> float:
        values = space.draw(trial, ranges, held if trial.number == 0 else {})   # unset in RAW: trial 0 keeps defaults
        settings = parse_params(space.with_values(RAW, values)).train
        torch.manual_seed(settings.seed)
        spec = model_spec(settings)
        models[trial.number], _ = train_model(build_model(spec["name"], layout, **spec["kwargs"]), train, val,
                                              settings, len(schema.classes))
        return classification_metrics(val.labels.numpy(), labels_of(models[trial.number], val), 2)[metric]

    study.optimize(objective, n_trials=TRIALS)
    champion, finalists = study.trials[0], ranked(study.trials)[:TOP_K]
    winner = finalists[0]
    assert winner.number != 0 and winner.value > champion.value + 0.05   # the search "found" a better configuration
    live = labels_of(models[0], holdout)
    verdicts = []
    for trial in finalists:   # as the sweep judges them: in validation order, each by bless against the champion
        report = assess_quality(HoldoutPredictions(prepared.holdout, holdout.labels.numpy(),
                                                   labels_of(models[trial.number], holdout), live, schema.classes),
                                params.bless, champion_version="1")
        blessing = Blessing(gate=report.gate, outcome=report.outcome, model_name="noise", candidate_path="model.onnx",
                            candidate_sha256="-", candidate_metrics=report.details["candidate"],
                            champion_version="1", stages=[report])
        finalist = Finalist(trial.number, trial.value, {}, ".", holdout=report.details["candidate"][metric])
        verdicts.append((finalist, report, accepts(blessing, require_better=True), accepts(blessing, False)))
    first = verdicts[0][0]
    # the winner's validation score looks good, well above chance; its holdout score is what noise gives
    assert first.validation > 0.58 and first.optimism > 0.05 and abs(first.holdout - 0.5) < 0.05, first
    for _, report, (accepted, verdict), (bless_passed, _) in verdicts:
        assert not accepted, verdict                  # nothing is registered
        assert report.details["gain"]["low"] <= 0     # none is shown better than the champion on the holdout
        if bless_passed:   # no worse than a champion that is noise too: the sweep's own rule is what refuses it
            assert "sweep.require_better" in verdict, verdict
    assert any(bless_passed for *_, (bless_passed, _) in verdicts), "no finalist exercised sweep.require_better"
