"""The decision rule (tasks/training/decision.py): on an imbalanced binary table an unweighted model's out-of-fold
probabilities move the macro-F1 threshold below 0.5, and the gain holds on new rows; the threshold rides in the
served graph, whose `decision` output applies it while its probabilities stay the calibrated ones, and the service,
`torchship predict` and MLflow's pyfunc answer those labels; without a real gain, and for more classes, nothing
moves. The class weighting follows the bless metric."""
from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pandas as pd
import pytest
import torch

from serving.app import create_app
from serving.service import ServiceSettings
from serving.variants import file_variant
from tasks.core.metrics import balances_classes, classification_metrics
from tasks.core.params_spec import ServeParams, TrackingParams, TrainParams
from tasks.core.runtime import DECISION, THRESHOLD_KEY, decide, open_onnx
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.scoring import predict_labels, predict_proba
from tasks.modalities.table.batch import predict_file
from tasks.modalities.table.graph import compose_raw_model, raw_signature
from tasks.modalities.table.layout import fit_layout
from tasks.training.adapt import fit_training
from tasks.training.crossval import Candidate, cross_validate, finish_cross_validation
from tasks.training.decision import MIN_GAIN, fit_class_weighting, fit_threshold
from tasks.training.loop import Split, Trainer, predict_logits
from tasks.variants.exporters import export_onnx
from tests.helpers import linear_raw_graph

with warnings.catch_warnings():  # starlette 1.x asks for httpx2 behind its TestClient; httpx still works
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.model

SCHEMA = Schema(source="t", target="y", classes=["stays", "leaves"],
                features=[Feature(name=f"x{i}", kind="numeric") for i in range(6)])
# Unweighted (what accuracy as the bless metric trains), so 0.5 is the accuracy threshold, not the macro-F1 one.
UNWEIGHTED = TrainParams(model="linear", adapt=False, epochs=20, batch_size=64, patience=20, warmup_fraction=0.1,
                         seed=0, lr=0.05)


def imbalanced(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """About 12% positives, drawn from a noisy logistic model of six numbers: the classes overlap."""
    rng = np.random.default_rng(seed)
    features = rng.normal(0, 1, (rows, 6)).astype(np.float32)
    score = features @ np.array([1.2, -0.8, 0.6, 0.0, 0.4, -0.3]) - 2.6
    labels = (rng.random(rows) < 1 / (1 + np.exp(-score))).astype(np.int64)
    return features, labels


class ConvergedTrainer(Trainer):
    """Keeps the last epoch, a converged (calibrated) logistic regression, instead of the best-F1 one: on 180-row
    folds that pick is often an underfit early epoch whose boundary happens to sit lower, a threshold in disguise
    fitted on the very rows scored out of fold."""

    def _end_epoch(self, *args) -> None:
        self.state.best = -math.inf
        super()._end_epoch(*args)


def unweighted_start(settings, tag, model, train: Split, val: Split, stop_on: str) -> Trainer:
    trainer = ConvergedTrainer(settings, 2, balanced=False, stop_on=stop_on)
    trainer.setup(model, train, val)
    return trainer


@pytest.fixture(scope="module")
def trained():
    """(the served ensemble, the cross-validation summary, fresh rows, their labels) on the imbalanced table."""
    torch.set_num_threads(1)
    features, labels = imbalanced(900, seed=0)
    train = Split(torch.from_numpy(features), torch.from_numpy(labels))
    layout = fit_layout(features, SCHEMA)
    fitted = fit_training(UNWEIGHTED.model_copy(update={"cv_max_rows": 2000}), len(labels))
    candidate = Candidate("linear", UNWEIGHTED, {"name": "linear", "kwargs": {}})
    chosen, runs = cross_validate([candidate], train, layout, 2, fitted.folds, 0, unweighted_start)
    ensemble, _, _, summary = finish_cross_validation(chosen, runs, layout, fitted, labels, "f1_macro")
    fresh, fresh_labels = imbalanced(3000, seed=1)
    return ensemble, summary, fresh, fresh_labels


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory) -> tuple[onnx.ModelProto, object]:
    """(the bare exported file's proto, the composed graph's path) with the fitted threshold."""
    ensemble, summary, _, _ = trained
    folder = tmp_path_factory.mktemp("decision")
    export_onnx(ensemble, SCHEMA, "legacy", folder / "bare.onnx", summary["decision"]["threshold"])
    bare = onnx.load(str(folder / "bare.onnx"))
    onnx.save(compose_raw_model(bare, SCHEMA), folder / "model.onnx")
    return bare, folder / "model.onnx"


def frame(features: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(features.astype(np.float64), columns=SCHEMA.feature_names)


def test_the_out_of_fold_threshold_beats_one_half_and_the_gain_holds_on_new_rows(trained):
    ensemble, summary, fresh, fresh_labels = trained
    decision = summary["decision"]
    assert decision["source"] == "out-of-fold" and decision["metric"] == "f1_macro" and decision["rows"] == 900
    assert decision["threshold"] < 0.5 and decision["at_threshold"] >= decision["at_default"] + MIN_GAIN, decision
    probabilities = torch.softmax(predict_logits(ensemble, torch.from_numpy(fresh)), 1).numpy()
    at = {t: classification_metrics(fresh_labels, decide(probabilities, t), 2)["f1_macro"]
          for t in (0.5, decision["threshold"])}
    assert at[decision["threshold"]] > at[0.5] + MIN_GAIN, at


def test_the_graph_carries_the_threshold_and_its_labels_follow_it_with_calibrated_probabilities(trained, served):
    ensemble, summary, fresh, _ = trained
    bare, path = served
    threshold = summary["decision"]["threshold"]
    assert {p.key: p.value for p in bare.metadata_props}[THRESHOLD_KEY] == repr(threshold)
    session = open_onnx(path, 1)
    probabilities = predict_proba(session, SCHEMA, frame(fresh))
    with torch.no_grad():
        calibrated = torch.softmax(ensemble(torch.from_numpy(fresh)), 1).numpy()   # the temperature inside
    np.testing.assert_allclose(probabilities, calibrated, atol=1e-5)
    labels = predict_labels(session, SCHEMA, frame(fresh))
    assert np.array_equal(labels, (probabilities[:, 1] > np.float32(threshold)).astype(np.int64))
    assert (labels != probabilities.argmax(1)).sum() > 20   # the rule, not the argmax, decides these rows


def test_the_service_and_predict_answer_the_graphs_labels(trained, served, tmp_path):
    _, _, fresh, _ = trained
    _, path = served
    rows = frame(fresh[:400])
    expected = [SCHEMA.classes[i] for i in predict_labels(open_onnx(path, 1), SCHEMA, rows)]
    settings = ServiceSettings(serve=ServeParams(request_log=""), model_name="m", tracking=TrackingParams(),
                               model_file=path)
    with TestClient(create_app(settings)) as client:
        response = client.post("/predict", json={"rows": rows.to_dict("records")})
    assert response.status_code == 200, response.text
    assert [p["label"] for p in response.json()["predictions"]] == expected
    rows.to_csv(tmp_path / "rows.csv", index=False)
    predict_file(tmp_path / "rows.csv", tmp_path / "scored.csv", file_variant("champion", path, 1),
                 show_progress=False)
    assert pd.read_csv(tmp_path / "scored.csv")["prediction"].tolist() == expected


def test_mlflow_pyfunc_answers_the_graphs_labels(trained, served, tmp_path, monkeypatch):
    """What `mlflow models serve` runs: the ONNX flavor's pyfunc, saved with register's signature."""
    import mlflow

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")

    _, _, fresh, _ = trained
    _, path = served
    rows = frame(fresh[:50])
    mlflow.onnx.save_model(onnx.load(str(path)), tmp_path / "model", signature=raw_signature(SCHEMA),
                           onnx_execution_providers=["CPUExecutionProvider"])
    answer = mlflow.pyfunc.load_model(str(tmp_path / "model")).predict(rows)
    decision = answer[DECISION].to_numpy().reshape(len(rows), -1)   # pyfunc flattens each (N, C) output
    assert np.array_equal(decision.argmax(1), predict_labels(open_onnx(path, 1), SCHEMA, rows))


def test_without_a_real_gain_the_threshold_stays_at_one_half():
    rng = np.random.default_rng(0)
    positive = rng.random(20000)
    labels = (rng.random(20000) < positive).astype(np.int64)   # calibrated: 0.5 is the accuracy optimum
    decision = fit_threshold(np.stack([1 - positive, positive], 1), labels, "accuracy", "validation")
    assert decision["threshold"] == 0.5 and decision["at_threshold"] == decision["at_default"], decision


def test_more_classes_keep_the_argmax():
    schema = SCHEMA.model_copy(update={"classes": ["a", "b", "c"], "features": SCHEMA.features[:2]})
    assert fit_threshold(np.full((4, 3), 1 / 3), np.array([0, 1, 2, 0]), "f1_macro", "out-of-fold") is None
    graph = linear_raw_graph(np.array([[1.0, -1.0, 0.5], [0.2, 0.3, -0.4]]), schema)
    session = open_onnx(graph.SerializeToString(), 1)
    rows = frame(np.random.default_rng(0).normal(0, 2, (200, 6)))[schema.feature_names]
    decision = session.run([DECISION], {name: rows[name].to_numpy() for name in schema.feature_names})[0]
    assert np.array_equal(decision.argmax(1), predict_proba(session, schema, rows).argmax(1))
    assert np.array_equal(decision.sum(1), np.ones(len(rows)))   # one-hot
    with pytest.raises(ValueError, match="binary"):
        linear_raw_graph(np.array([[1.0, -1.0, 0.5], [0.2, 0.3, -0.4]]), schema, {THRESHOLD_KEY: "0.3"})


def test_the_bless_metric_sets_the_class_weighting():
    assert balances_classes("f1_macro") and not balances_classes("accuracy")
    split = Split(torch.zeros(8, 6), torch.tensor([0] * 6 + [1] * 2))
    for balanced in (True, False):
        trainer = Trainer(UNWEIGHTED, 2, balanced=balanced)
        trainer.setup(torch.nn.Linear(6, 2), split, split)
        weight = trainer.loss_fn.weight
        assert (weight is not None and weight.tolist() == pytest.approx([8 / 12, 8 / 4])) if balanced \
            else weight is None


def test_out_of_fold_evidence_picks_the_class_weighting_of_a_multi_class_model():
    """A loss weighted by 1 / prior learns p(c|x) / prior(c): where accuracy is the metric, adding log prior back
    decides as unweighted training would, and is kept only when the out-of-fold figure gains."""
    rng = np.random.default_rng(0)
    true = rng.dirichlet([0.7, 0.2, 0.1], size=3000)                     # p(c|x) per row, priors in
    labels = np.array([rng.choice(3, p=row) for row in true])             # each row's label drawn from it
    prior = np.bincount(labels, minlength=3) / len(labels)
    balanced_view = np.log(true / prior)                                  # what balanced training learns
    chosen = fit_class_weighting(balanced_view, labels, "accuracy", balanced=True)
    assert chosen["weighting"] == "none" and chosen["at_other"] >= chosen["at_trained"] + MIN_GAIN, chosen
    assert np.array_equal((balanced_view + chosen["class_bias"]).argmax(1), np.log(true).argmax(1))
    kept = fit_class_weighting(np.log(true), labels, "accuracy", balanced=False)   # already the accuracy optimum
    assert kept["weighting"] == "none" and kept["class_bias"] == [0.0, 0.0, 0.0], kept
    assert fit_class_weighting(np.log(np.full((4, 2), 0.5)), np.array([0, 1, 0, 1]), "f1_macro", True) is None
