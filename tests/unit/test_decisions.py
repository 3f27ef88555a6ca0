"""The pure decision cores: bless.judge_candidate, compress.accuracy_budget (the canary's: test_canary_analysis.py)."""
from __future__ import annotations

import pytest

from tasks.bless.quality import judge_candidate
from tasks.compress import accuracy_budget
from tasks.core.params_spec import BlessParams, CompressParams
from tasks.core.verdicts import BlessOutcome


def test_first_model_passes():
    result = judge_candidate({"f1_macro": 0.1, "accuracy": 0.5}, None, True, BlessParams())
    assert result.outcome is BlessOutcome.FIRST_MODEL and result.gate.status == "pass"
    assert "first model" in result.gate.reasons[0]


@pytest.mark.parametrize("candidate, champion, status",
                         [(0.70, 0.80, "fail"), (0.80, 0.80, "pass"), (0.81, 0.80, "pass")])
def test_candidate_must_not_lose_on_the_metric(candidate, champion, status):
    result = judge_candidate({"f1_macro": candidate}, {"f1_macro": champion}, True, BlessParams(metric="f1_macro"),
                             champion_version="3")
    assert result.gate.status == status
    assert "v3" in result.gate.reasons[0]


def test_the_configured_metric_is_the_one_compared():
    candidate, champion = {"f1_macro": 0.9, "accuracy": 0.6}, {"f1_macro": 0.5, "accuracy": 0.7}
    assert judge_candidate(candidate, champion, True, BlessParams(metric="accuracy")).gate.status == "fail"
    assert judge_candidate(candidate, champion, True, BlessParams(metric="f1_macro")).gate.status == "pass"


def test_incomparable_signature_fails_even_when_better():
    result = judge_candidate({"f1_macro": 0.99}, {}, False, BlessParams(), champion_version="2")
    assert result.outcome is BlessOutcome.INCOMPARABLE and result.gate.status == "fail"
    assert "signature" in result.gate.reasons[0]


@pytest.mark.parametrize("max_regression, candidate, status", [
    (0.01, 0.795, "warn"), (0.01, 0.785, "fail"), (0.0, 0.795, "fail"), (0.01, 0.80, "pass")])
def test_a_loss_within_max_regression_warns_and_beyond_it_fails(max_regression, candidate, status):
    rules = BlessParams(metric="f1_macro", max_regression=max_regression)
    assert judge_candidate({"f1_macro": candidate}, {"f1_macro": 0.80}, True, rules).gate.status == status


def drop(point: float, low: float | None = None, high: float | None = None) -> dict:
    return {"drop": point, "low": point - 0.01 if low is None else low, "high": point + 0.01 if high is None else high}


@pytest.mark.parametrize("point, status", [(0.0, "pass"), (0.004, "pass"), (0.0051, "fail"), (-0.05, "pass")])
def test_accuracy_budget_gates_on_the_point_estimate(point, status):
    result = accuracy_budget("onnx-int8", drop(point), CompressParams(max_drop=0.005))
    assert result.status == status
    assert result.gate == "accuracy budget onnx-int8"


def test_accuracy_budget_reports_the_drop_and_its_interval_in_points():
    result = accuracy_budget("x", drop(0.05, 0.03, 0.07), CompressParams(max_drop=0.01, metric="accuracy"))
    assert result.status == "fail"
    assert "accuracy drop +5.00 points (95% CI +3.00 to +7.00) > budget 1.00" in result.reasons[0]
