"""The pure decision cores: bless.judge_candidate, compress.accuracy_budget, canary.analyse."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.bless import judge_candidate
from tasks.canary import analyse
from tasks.compress import accuracy_budget
from tasks.config import BlessParams, CanaryParams, CompressParams
from tasks.core.verdicts import BlessOutcome


def test_first_model_passes():
    result = judge_candidate({"f1_macro": 0.1, "accuracy": 0.5}, None, True, BlessParams())
    assert result.outcome is BlessOutcome.FIRST_MODEL and result.gate.status == "pass"
    assert "first model" in result.gate.reasons[0]


@pytest.mark.parametrize("candidate, champion, status", [(0.70, 0.80, "fail"), (0.80, 0.80, "pass"), (0.81, 0.80, "pass")])
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


def traffic(seed: int = 0, n: int = 200, champion_acc: float = 0.8, challenger_acc: float = 0.8,
            challenger_ms: float = 10.0, challenger_errors: int = 0) -> pd.DataFrame:
    """Hand-built replay log: half the requests to each variant."""
    rng = np.random.default_rng(seed)
    rows = []
    for variant, version, acc, ms in (("champion", "1", champion_acc, 10.0), ("challenger", "2", challenger_acc, challenger_ms)):
        correct = rng.random(n) < acc
        ok = np.ones(n, dtype=bool)
        if variant == "challenger":
            ok[:challenger_errors] = False
        for i in range(n):
            rows.append({"variant": variant, "version": version, "ok": bool(ok[i]), "correct": bool(ok[i] and correct[i]),
                         "ms": float(ms * rng.uniform(0.8, 1.2))})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)


def test_equal_variants_pass_and_are_summarised():
    log = traffic()
    result, summary = analyse(log, CanaryParams())
    assert result.status == "pass", result.reasons
    assert set(summary) == {"champion", "challenger"}
    challenger = log[log.variant == "challenger"]
    assert summary["challenger"].requests == len(challenger)
    assert summary["challenger"].version == "2"
    assert summary["challenger"].accuracy == pytest.approx(challenger["correct"].mean())
    assert summary["challenger"].p95_ms == pytest.approx(np.percentile(challenger["ms"], 95))


def test_challenger_errors_fail():
    result, summary = analyse(traffic(challenger_errors=3), CanaryParams(max_error_rate=0.0))
    assert result.status == "fail" and any("error rate" in r for r in result.reasons)
    assert summary["challenger"].errors == 3


def test_error_rate_within_the_budget_passes():
    result, _ = analyse(traffic(challenger_errors=1, challenger_acc=0.9), CanaryParams(max_error_rate=0.01))
    assert result.status == "pass", result.reasons


def test_accuracy_drop_fails():
    result, _ = analyse(traffic(champion_acc=0.9, challenger_acc=0.6), CanaryParams(max_metric_drop=0.05))
    assert result.status == "fail" and any("accuracy" in r for r in result.reasons)


def test_p95_ratio_fails():
    result, _ = analyse(traffic(challenger_ms=50.0), CanaryParams(max_p95_ratio=3.0))
    assert result.status == "fail" and any("p95" in r for r in result.reasons)
    relaxed, _ = analyse(traffic(challenger_ms=50.0), CanaryParams(max_p95_ratio=10.0))
    assert relaxed.status == "pass"


@pytest.mark.parametrize("missing", ["champion", "challenger"])
def test_a_variant_without_traffic_fails(missing):
    log = traffic()
    result, _ = analyse(log[log.variant != missing], CanaryParams())
    assert result.status == "fail" and "no requests" in result.reasons[0]


def test_unattributed_failed_requests_do_not_pass():
    log = traffic()
    failed = pd.DataFrame([{"variant": "unknown", "version": "", "ok": False, "correct": False, "ms": 5.0}] * 20)
    result, _ = analyse(pd.concat([log, failed], ignore_index=True), CanaryParams(max_error_rate=0.0))
    assert result.status != "pass"
