"""The baseline gate with its real figures: scikit-learn baselines fit on the same splits, a candidate trained
by the real engine on shuffled labels is never blessed (neither as a first model nor against a champion), and
one trained on the true labels is."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import build_model
from tasks.baseline import fit_baselines
from tasks.bless import judge_candidate
from tasks.config import BaselineParams, BlessParams
from tasks.core.metrics import classification_metrics
from tasks.core.verdicts import BlessOutcome
from tasks.training.loop import Split, predict_logits, train_model
from tasks.training.weights import model_spec
from tests.model.conftest import encode_split

RULES = BlessParams()   # the real gap (params.yaml default), not the tests' loose one


@pytest.fixture(scope="module")
def baselines(encoded):
    prepared = encoded.prepared
    return fit_baselines(prepared.train, prepared.holdout, prepared.schema, BaselineParams(), balanced=True)


def holdout_metrics(encoded, labels: torch.Tensor, params) -> dict[str, float]:
    torch.manual_seed(0)
    spec = model_spec(params)
    model = build_model(spec["name"], encoded.layout, **spec["kwargs"])
    model, _ = train_model(model, Split(encoded.train.features, labels), encoded.val, params)
    holdout = encode_split(encoded.prepared.holdout, encoded.prepared.schema)
    predicted = predict_logits(model, holdout.features).argmax(1).numpy()
    return classification_metrics(holdout.labels.numpy(), predicted, len(encoded.prepared.schema.classes))


def test_baselines_learn_the_table(encoded, baselines):
    labels = encode_split(encoded.prepared.holdout, encoded.prepared.schema).labels.numpy()
    constant = classification_metrics(labels, np.full_like(labels, np.bincount(labels).argmax()), 2)["f1_macro"]
    assert set(baselines) == {"logistic_regression", "hist_gradient_boosting"}
    assert all(b["f1_macro"] > constant + 0.1 for b in baselines.values()), (baselines, constant)


def test_a_candidate_trained_on_shuffled_labels_is_never_blessed(encoded, tiny_train, baselines):
    order = torch.randperm(len(encoded.train.labels), generator=torch.Generator().manual_seed(0))
    shuffled = encoded.train.labels[order]
    candidate = holdout_metrics(encoded, shuffled, tiny_train)
    first = judge_candidate(candidate, None, True, RULES, baselines=baselines)
    assert first.outcome is BlessOutcome.BELOW_BASELINES and first.gate.status == "fail", first
    assert first.gate.reasons[0].startswith("worse than a few lines of scikit-learn"), first
    champion = {k: v - 0.2 for k, v in candidate.items()}   # even against a champion it would beat
    assert judge_candidate(candidate, champion, True, RULES, "1", baselines).outcome is BlessOutcome.BELOW_BASELINES


def test_a_candidate_trained_on_the_true_labels_is_blessed(encoded, tiny_train, baselines):
    candidate = holdout_metrics(encoded, encoded.train.labels, tiny_train.model_copy(update={"epochs": 12}))
    best = max(b["f1_macro"] for b in baselines.values())
    verdict = judge_candidate(candidate, None, True, RULES, baselines=baselines)
    print(f"candidate f1_macro {candidate['f1_macro']:.4f}, best baseline {best:.4f}")
    assert verdict.outcome is BlessOutcome.FIRST_MODEL and verdict.gate.status == "pass", (verdict, candidate, best)
    assert "baselines: logistic regression" in verdict.gate.reasons[0]
