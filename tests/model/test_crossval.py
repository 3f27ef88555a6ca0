"""Cross-validated training below train.cv_max_rows (tasks/training/crossval.py): stratified folds, members
early-stopped on an inner split of their own training part (never on the fold they score), the family picked on
the out-of-fold score and recorded, and the members served as one ONNX graph whose probabilities are the mean of
theirs (behind the raw-row front), within bless's latency gate against one network, its int8 variants included."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.ensemble import FoldEnsemble
from tasks.config import default_params
from tasks.core.labels import encode_target
from tasks.core.metrics import classification_metrics
from tasks.core.params_spec import PrepareParams, TrainParams
from tasks.core.runtime import open_onnx
from tasks.modalities.scoring import predict_proba
from tasks.modalities.table.encoding import encode_features
from tasks.modalities.table.graph import compose_raw_model
from tasks.modalities.table.layout import fit_layout
from tasks.modalities.table.prepare import prepare_tables
from tasks.modalities.table.probe import raw_probe_rows
from tasks.modalities.table.sources import load_sklearn
from tasks.training.adapt import fit_training
from tasks.training.calibration import calibrate, tempered
from tasks.training.crossval import (
    SELECTION_METRIC,
    Candidate,
    cross_validate,
    cross_validation_headline,
    finish_cross_validation,
    fold_assignment,
    pick_family,
)
from tasks.training.loop import Split, Trainer, predict_logits
from tasks.training.weights import build_trained
from tasks.variants.exporters import export_onnx

pytestmark = pytest.mark.model

# Few epochs, no schedule fitting: the wine table (~125 training rows, 13 numeric columns, 3 classes) learns in 20.
QUICK = TrainParams(adapt=False, epochs=20, batch_size=32, patience=20, warmup_fraction=0.1, seed=0,
                    model_args={"mlp": {"hidden": [16], "dropout": 0.0},
                                "mlp_plr": {"hidden": [16], "dropout": 0.0, "frequencies": 4, "numeric_dim": 4}})


def split_of(frame, schema) -> Split:
    return Split(torch.from_numpy(encode_features(frame, schema)),
                 torch.from_numpy(encode_target(frame[schema.target], schema)))


@pytest.fixture(scope="module")
def wine():
    torch.set_num_threads(1)
    prepared = prepare_tables(load_sklearn("wine"), "target", "sklearn:wine", PrepareParams(seed=0))
    train = split_of(prepared.train, prepared.schema)
    return prepared, train, split_of(prepared.val, prepared.schema), fit_layout(train.features.numpy(),
                                                                                prepared.schema)


def plain_start(settings: TrainParams, tag: str, model, train: Split, val: Split, stop_on: str) -> Trainer:
    """The single-process trainer (no torchrun, no checkpoints): what JobTrainer runs, minus persistence."""
    trainer = Trainer(settings, 3, stop_on=stop_on)
    trainer.setup(model, train, val)
    return trainer


@pytest.fixture(scope="module")
def cross_validated(wine):
    prepared, train, _, layout = wine
    fitted = fit_training(QUICK.model_copy(update={"model": "auto"}), len(train.labels))
    candidates = []
    for name, lr in fitted.candidates.items():
        settings = QUICK.model_copy(update={"model": name, "lr": lr})
        candidates.append(Candidate(name, settings, {"name": name, "kwargs": settings.model_args.get(name, {})}))
    chosen, runs = cross_validate(candidates, train, layout, 3, fitted.folds, 0, plain_start)
    return fitted, chosen, runs, finish_cross_validation(chosen, runs, layout, fitted, train.labels.numpy())


def test_the_validation_rows_train_too_and_are_scored_out_of_fold(wine):
    """Members early-stop on inner splits of their own part, so cross-validation deals the training and the
    validation split into folds: no row of a small table sits idle (the holdout stays out)."""
    from tasks.training.crossval import cross_validation_rows

    _, train, val, _ = wine
    joined = cross_validation_rows(train, val)
    assert torch.equal(joined.features, torch.cat([train.features, val.features]))
    assert torch.equal(joined.labels, torch.cat([train.labels, val.labels])) and joined.soft is None


def test_folds_are_stratified_balanced_and_seeded():
    labels = np.array([0] * 50 + [1] * 23 + [2] * 7)
    folds = fold_assignment(labels, 5, seed=3)
    sizes = np.bincount(folds, minlength=5)
    assert sizes.max() - sizes.min() <= 1
    for label, count in ((0, 50), (1, 23), (2, 7)):
        per_fold = np.bincount(folds[labels == label], minlength=5)
        assert per_fold.max() - per_fold.min() <= 1 and per_fold.sum() == count
    assert np.array_equal(folds, fold_assignment(labels, 5, seed=3))
    assert not np.array_equal(folds, fold_assignment(labels, 5, seed=4))


def test_every_member_trains_on_its_own_part_and_every_row_is_scored_out_of_fold(wine, cross_validated):
    _, train, _, _ = wine
    fitted, chosen, runs, _ = cross_validated
    assert fitted.folds == 5 and [run.candidate.name for run in runs] == ["linear", "mlp_plr"]
    for run in runs:
        assert len(run.members) == 5 and {r["fold"] for r in run.history} == {1, 2, 3, 4, 5}
        assert np.allclose(np.exp(run.out_of_fold).sum(1), 1.0, atol=1e-5)   # every row: its held-out member's vote
        assert run.scores == classification_metrics(train.labels.numpy(), run.out_of_fold.argmax(1), 3)
    assert chosen.scores[SELECTION_METRIC] == max(run.scores[SELECTION_METRIC] for run in runs)


def test_the_ensemble_learns_a_small_sklearn_table(wine, cross_validated):
    prepared, _, val, layout = wine
    _, chosen, _, (ensemble, spec, _, _) = cross_validated
    assert chosen.scores["accuracy"] > 0.85
    scores = classification_metrics(val.labels.numpy(), predict_logits(ensemble, val.features).argmax(1).numpy(), 3)
    assert scores["accuracy"] > 0.85, scores
    rebuilt = build_trained(spec, layout)   # what load_trained builds from the saved spec
    rebuilt.load_state_dict(ensemble.state_dict())
    assert torch.equal(predict_logits(rebuilt, val.features), predict_logits(ensemble, val.features))


def test_the_family_choice_and_every_candidates_score_are_recorded(wine, cross_validated):
    labels = wine[1].labels.numpy()
    fitted, chosen, runs, (ensemble, spec, recorded, summary) = cross_validated
    name = chosen.candidate.name
    assert recorded.model == name and recorded.lr == fitted.candidates[name] and spec["name"] == name
    assert summary["chosen"] == name and summary["folds"] == 5 == spec["members"]
    assert summary["candidates"] == {run.candidate.name: run.scores for run in runs}
    assert summary["calibration"] == calibrate(chosen.out_of_fold, labels)   # from the chosen run's own folds
    assert float(ensemble.temperature) == pytest.approx(summary["calibration"]["temperature"])
    headline = cross_validation_headline(summary)
    assert f"picked {name}" in headline and all(run.candidate.name in headline for run in runs)
    assert recorded.reasons[-1].startswith(f"auto picked {name} by out-of-fold f1_macro: linear 0.")


def test_a_tie_goes_to_the_simpler_family(cross_validated):
    _, _, runs, _ = cross_validated
    tied = [type(run)(run.candidate, run.members, run.history, run.out_of_fold, {SELECTION_METRIC: 0.9})
            for run in runs]
    assert pick_family(tied).candidate.name == "linear"


@pytest.mark.parametrize("temperature,class_bias", [(1.0, None), (1.7, [0.4, -0.3, 0.0])])
def test_the_served_graph_averages_its_members_probabilities_at_its_temperature(wine, cross_validated, tmp_path,
                                                                                 temperature, class_bias):
    import onnx

    prepared, _, _, layout = wine
    _, _, _, (ensemble, spec, _, _) = cross_validated
    tempered_ensemble = FoldEnsemble(list(ensemble.members), temperature, class_bias).eval()
    rebuilt = build_trained({**spec, "class_bias": class_bias is not None}, layout)   # what load_trained builds
    rebuilt.load_state_dict(tempered_ensemble.state_dict())
    schema = prepared.schema
    path = tmp_path / "ensemble.onnx"
    export_onnx(tempered_ensemble, schema, "legacy", path)   # dynamo (the default) passes too (export stage), slower
    served = open_onnx(compose_raw_model(onnx.load(str(path)), schema).SerializeToString(), 1)
    rows = raw_probe_rows(prepared.holdout, schema, 64)   # holdout rows plus missing and far-out values
    encoded = torch.from_numpy(encode_features(rows, schema))
    with torch.no_grad():
        each = [member(encoded) for member in ensemble.members]
        mean = torch.stack([torch.softmax(logits, 1) for logits in each]).mean(0).numpy()
        # log of the mean without log(0) where a far-out row gives a class no probability at all
        log_mean = (torch.logsumexp(torch.stack([torch.log_softmax(z, 1) for z in each]), 0) - np.log(len(each)))
    probabilities = predict_proba(served, schema, rows)
    expected = tempered(log_mean.numpy() + temperature * np.asarray(class_bias or 0.0), temperature)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    np.testing.assert_allclose(torch.softmax(predict_logits(rebuilt, encoded), 1).numpy(), expected, atol=1e-5)
    if class_bias is None:
        assert np.array_equal(probabilities.argmax(1), mean.argmax(1))   # a temperature never changes the class
    if temperature == 1.0:
        np.testing.assert_allclose(probabilities, mean, atol=1e-5)


def test_the_train_report_records_the_choice_in_metrics_headline_and_mlflow(wine, cross_validated, tmp_path):
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from tasks.core.params_spec import Params, TrackingParams
    from tasks.training.report import report_training

    prepared, _, val, _ = wine
    _, chosen, runs, (ensemble, _, fitted, summary) = cross_validated
    tracking = TrackingParams(uri=f"sqlite:///{tmp_path}/mlflow.db", artifacts=str(tmp_path / "artifacts"))
    runtime = SimpleNamespace(backend="gloo", world=1, device="cpu", precision="fp32", precision_note="",
                              strategy="ddp", notes=())
    metrics = report_training(Params(tracking=tracking), ensemble, val, chosen.history, prepared.schema, runtime,
                              folder=tmp_path / "train", train_params=chosen.candidate.settings, fitted=fitted,
                              cross_validation=summary)
    assert metrics["cross_validation"] == summary and metrics["fitted"]["model"] == chosen.candidate.name
    assert summary["decision"] is None and metrics["threshold"] is None   # three classes: the argmax stays
    assert metrics["temperature"] == summary["calibration"]["temperature"]
    assert cross_validation_headline(summary) in metrics["headline"]
    run = MlflowClient(tracking.resolved_uri()).search_runs([MlflowClient(tracking.resolved_uri())
                                                             .get_experiment_by_name("torchship").experiment_id])[0]
    assert run.data.params["cv_chosen_model"] == chosen.candidate.name and run.data.params["cv_members"] == "5"
    for candidate in runs:
        name = candidate.candidate.name
        assert run.data.metrics[f"oof_{name}_f1_macro"] == pytest.approx(candidate.scores["f1_macro"])
    assert run.data.metrics["calibration_temperature"] == pytest.approx(summary["calibration"]["temperature"])


def test_the_averaging_graph_passes_the_bless_latency_gate_against_one_network_and_quantises(tmp_path):
    """Five default MLPs averaged (temperature and threshold in) vs one, timed as bless times them; the raw-row
    front dominates a one-row call, so the members cost little. Its int8 files still compose and decide."""
    from functools import partial

    import onnx
    import pandas as pd

    from models import build_model
    from tasks.bless.performance import assess_performance
    from tasks.core.machine import describe_machine
    from tasks.core.runtime import decide
    from tasks.core.schema_spec import Feature, Schema
    from tasks.core.timing import confirmed, time_interleaved
    from tasks.modalities.scoring import predict_labels
    from tasks.variants.quantize import quantize_onnx, quantize_onnx_static

    params = default_params()
    schema = Schema(source="t", target="y", classes=["no", "yes"],
                    features=[Feature(name=f"c{i}", kind="numeric") for i in range(30)])   # breast cancer's width
    rows = np.random.default_rng(0).normal(0, 1, (256, 30)).astype(np.float32)
    layout = fit_layout(rows, schema)
    torch.manual_seed(0)
    members = [build_model("mlp", layout).eval() for _ in range(5)]
    export_onnx(members[0], schema, "legacy", tmp_path / "one.onnx")
    export_onnx(FoldEnsemble(members, 1.3).eval(), schema, "legacy", tmp_path / "five.onnx", 0.37)
    quantize_onnx(tmp_path / "five.onnx", tmp_path / "five-int8.onnx")
    quantize_onnx_static(tmp_path / "five.onnx", tmp_path / "five-int8-static.onnx", rows)
    frame = pd.DataFrame(rows.astype(np.float64), columns=schema.feature_names)
    graphs = {name: open_onnx(compose_raw_model(onnx.load(str(tmp_path / f"{name}.onnx")), schema)
                              .SerializeToString(), params.serve.threads)
              for name in ("one", "five", "five-int8", "five-int8-static")}
    for name in ("five", "five-int8", "five-int8-static"):
        labels = predict_labels(graphs[name], schema, frame)
        assert np.array_equal(labels, decide(predict_proba(graphs[name], schema, frame), 0.37)), name
    timed = {"candidate": partial(predict_proba, graphs["five"], schema),
             "champion": partial(predict_proba, graphs["one"], schema)}
    one_row = [frame.iloc[[i]] for i in range(64)]
    batch = frame.iloc[np.resize(np.arange(len(frame)), params.profile.batch_size)]

    def measure():
        timings = time_interleaved(timed, one_row, batch, params.bless.latency_rounds, 0.1)
        return timings, assess_performance(timings, {"candidate": 1, "champion": 1}, describe_machine(1),
                                           params.profile.batch_size, params.slo.p99_ms,
                                           params.bless.max_latency_ratio)

    _, report = confirmed(measure)
    print(report.headline)
    assert report.gate.status == "pass", report.gate.reasons


def test_out_of_fold_rows_never_steer_the_member_that_scores_them(wine):
    """Honest out-of-fold figures: a member's training and early stopping use only its own training part, so
    relabelling its held-out fold (here: every held-out row given the next class, so learning looks like getting
    worse there) leaves that member's weights, and so its
    out-of-fold predictions, exactly as they were. A member early-stopped on the fold it is scored on fails this."""
    from tasks.training.crossval import train_family

    prepared, train, _, layout = wine
    candidate = Candidate("mlp", QUICK.model_copy(update={"model": "mlp", "lr": 3e-3, "patience": 2}),
                          {"name": "mlp", "kwargs": QUICK.model_args["mlp"]})
    assignment = fold_assignment(train.labels.numpy(), 3, seed=0)
    relabelled = Split(train.features, torch.where(torch.from_numpy(assignment == 0), (train.labels + 1) % 3,
                                                 train.labels))
    runs = [train_family(candidate, split, layout, assignment, 3, plain_start) for split in (train, relabelled)]
    for name, weights in runs[0].members[0].items():
        assert torch.equal(weights, runs[1].members[0][name]), name
    held = assignment == 0
    assert np.array_equal(runs[0].out_of_fold[held], runs[1].out_of_fold[held])
