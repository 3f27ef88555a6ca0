"""bless's stages: the pure cores' decisions (bootstrap claim rules, slices, max_regression, SLO breaches, stop at
the first failure), and with real models trained here: a candidate trained on shuffled labels is never blessed (the
baseline gate, and the champion comparison with that gate off) while one trained on the true labels is; and the
candidate file in the real service (`python -m serving --model-file`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from models import build_model
from tasks.bless.performance import assess_performance
from tasks.bless.quality import HoldoutPredictions, assess_quality, judge_candidate, score_slices, slice_groups
from tasks.bless.service import judge_service, load_figures, try_in_service
from tasks.bless.stages import combine, combine_outcomes, run_stages
from tasks.core.gate import GateResult
from tasks.core.metrics import paired_bootstrap
from tasks.core.params_spec import BaselineParams, BlessParams, SloParams
from tasks.core.timing import Timings, confirmed
from tasks.core.verdicts import BlessOutcome, StageReport
from tasks.modalities.table.baseline import fit_baselines
from tasks.modalities.table.requests import request_rows
from tasks.training.loop import Split, predict_logits, train_model
from tasks.training.weights import model_spec
from tests.model.conftest import encode_split

RULES = BlessParams(bootstrap=300)   # the real thresholds; fewer resamples keep the tests quick
CHAMPION = {"f1_macro": 0.80, "accuracy": 0.85}


def gain(point: float, low: float, high: float) -> dict:
    return {"difference": point, "low": low, "high": high, "confidence": 0.95, "resamples": 300}


def candidate(point: float) -> dict:
    return {"f1_macro": CHAMPION["f1_macro"] + point, "accuracy": 0.85}


# --- quality: the claim rules on the paired interval ------------------------------------------------------------

WORSE, REGRESSION = BlessOutcome.WORSE_WITHIN_TOLERANCE, BlessOutcome.REGRESSION


@pytest.mark.parametrize("point, low, high, outcome, status, words", [
    (0.03, 0.01, 0.05, BlessOutcome.BETTER, "pass", "better"),           # interval above 0: a gain is claimed
    (0.01, -0.01, 0.03, BlessOutcome.NO_WORSE, "pass", "no worse, not shown better"),   # straddles 0: no claim
    (-0.005, -0.02, 0.01, WORSE, "warn", "within noise"),                # straddles 0, negative point
    (-0.008, -0.012, -0.004, WORSE, "warn", "worse, within"),            # a real but tolerated loss
    (-0.02, -0.04, 0.001, REGRESSION, "fail", "regression beyond bless.max_regression 0.01"),
])
def test_a_gain_is_claimed_only_when_the_interval_says_so(point, low, high, outcome, status, words):
    result = judge_candidate(candidate(point), CHAMPION, True, RULES, "4", gain=gain(point, low, high))
    assert result.outcome is outcome and result.gate.status == status, result
    assert words in result.gate.reasons[0] and "v4" in result.gate.reasons[0], result


def test_max_regression_is_the_tolerated_loss():
    loose = RULES.model_copy(update={"max_regression": 0.05})
    assert judge_candidate(candidate(-0.03), CHAMPION, True, RULES, "1").gate.status == "fail"
    assert judge_candidate(candidate(-0.03), CHAMPION, True, loose, "1").gate.status == "warn"


def test_paired_bootstrap_cancels_what_both_models_share():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 2000)
    champion = np.where(rng.random(2000) < 0.75, labels, 1 - labels)
    better = np.where(rng.random(2000) < 0.5, labels, champion)   # right wherever the champion was, and more
    same = paired_bootstrap(labels, champion, champion, 2, "accuracy", 200)
    assert same["difference"] == same["low"] == same["high"] == 0.0
    gained = paired_bootstrap(labels, better, champion, 2, "accuracy", 200)
    assert 0 < gained["low"] < gained["difference"] < gained["high"]


# --- quality: slices -------------------------------------------------------------------------------------------

def test_slices_are_categories_or_quantile_bins_with_missing_values_apart():
    plan = slice_groups(pd.Series(["basic", "premium", None, "basic"]), 4)
    assert {k: v.tolist() for k, v in plan.items()} == {
        "(missing)": [False, False, True, False], "basic": [True, False, False, True],
        "premium": [False, True, False, False]}
    tenure = slice_groups(pd.Series(np.r_[np.arange(100.0), np.nan]), 4)
    assert len(tenure) == 5 and tenure["(missing)"].sum() == 1
    assert sorted(mask.sum() for name, mask in tenure.items() if name != "(missing)") == [25, 25, 25, 25]


def sliced(candidate_wrong_in: str | None = None, rows_per_plan: int = 300) -> HoldoutPredictions:
    """Two plans of `rows_per_plan` rows; the champion is always right, the candidate too except on 40% of the
    rows of plan `candidate_wrong_in`."""
    rng = np.random.default_rng(1)
    plans = np.repeat(["basic", "premium"], rows_per_plan)
    labels = rng.integers(0, 2, len(plans))
    champion, cand = labels.copy(), labels.copy()
    if candidate_wrong_in:
        hit = (plans == candidate_wrong_in) & (rng.random(len(plans)) < 0.4)
        cand[hit] = 1 - labels[hit]
    return HoldoutPredictions(pd.DataFrame({"plan": plans, "age": rng.normal(40, 10, len(plans))}), labels, cand,
                              champion, ["no", "yes"])


def test_a_slice_below_min_slice_rows_is_reported_but_not_judged():
    rules = RULES.model_copy(update={"slices": ["plan", "age", "region"], "min_slice_rows": 301})
    report = score_slices(sliced("premium"), rules)
    assert report["region"] == {"skipped": "not a column of this holdout"}
    assert report["plan"]["kind"] == "categorical" and report["age"]["kind"] == "numeric"
    premium = report["plan"]["slices"]["premium"]
    assert premium["rows"] == 300 and not premium["judged"] and premium["candidate"] < premium["champion"]
    assert len(report["age"]["slices"]) == rules.slice_bins
    assert not any(r.startswith("slice") for r in assess_quality(sliced("premium"), rules, "2").gate.reasons)


def test_a_judged_slice_that_regresses_fails_even_when_the_whole_holdout_does_not():
    rules = RULES.model_copy(update={"max_regression": 0.5})   # overall loss tolerated: only the slice can fail
    report = assess_quality(sliced("premium"), rules, "2")
    assert report.gate.status == "fail" and report.outcome is BlessOutcome.SLICE_REGRESSION
    assert any(r.startswith("slice plan=premium (300 rows)") for r in report.gate.reasons), report.gate.reasons
    assert not any("plan=basic" in r for r in report.gate.reasons)
    assert assess_quality(sliced(None), rules, "2").outcome is BlessOutcome.NO_WORSE


def test_quality_reports_per_class_figures_for_both_models():
    report = assess_quality(sliced("basic"), RULES, "2")
    assert set(report.details["per_class"]) == {"no", "yes"}
    assert set(report.details["per_class"]["yes"]) == {"candidate", "champion"}
    assert set(report.details["per_class"]["yes"]["candidate"]) == {"precision", "recall", "f1", "support"}


# --- performance and service: the SLO, judged on the model and not the machine --------------------------------

def steady(us: float, calls: int = 300, stalls: int = 0, stall_us: float = 20_000.0) -> np.ndarray:
    """`calls` batch-1 timings of `us`, the last `stalls` of them hit by a stall of the machine."""
    return np.r_[np.full(calls - stalls, us), np.full(stalls, stall_us)]


def performance(candidate_us: np.ndarray, champion_us: np.ndarray | None = None, p99_ms: float = 100.0,
                max_ratio: float = 2.0) -> StageReport:
    latencies = {"candidate": candidate_us} | ({"champion": champion_us} if champion_us is not None else {})
    timings = Timings(latencies, {name: 5e4 for name in latencies})
    return assess_performance(timings, {name: 10 for name in latencies}, {"cpu": "x"}, 256, p99_ms, max_ratio,
                              {"cores": 2, "load_1m": 3.9, "busy_share": 0.97}, resamples=300)


@pytest.mark.parametrize("candidate_us, champion_us, status", [
    (steady(500.0), None, "pass"), (steady(500.0), steady(400.0), "pass"),
    (steady(150_000.0), None, "fail"),                          # beyond slo.p99_ms on every call
    (steady(1000.0), steady(400.0), "fail")])                   # 2.5x the champion on every call
def test_performance_fails_on_the_slo_or_a_slower_candidate(candidate_us, champion_us, status):
    report = performance(candidate_us, champion_us)
    assert report.gate.status == status, report.gate.reasons
    assert "load 3.9 on 2 cores, CPU 97% busy" in report.gate.reasons[0]   # the box's load beside the figures


def test_performance_report_carries_both_models_the_machine_and_its_load():
    report = performance(steady(300.0, 100), steady(200.0, 100))
    assert report.gate.status == "pass" and report.details["p50_ratio"] == pytest.approx(1.5)
    assert report.details["machine"] == {"cpu": "x"} and report.details["models"]["champion"]["bytes"] == 10
    assert report.details["load"]["busy_share"] == 0.97 and report.details["p99_ratio_interval"]["low"] > 1.0


def test_a_few_stalls_of_the_machine_never_fail_a_model_a_steadily_slower_one_does():
    """Five calls of 300 hit by a 20 ms stall make the candidate's p99 40x the champion's, but not in the blocks
    without them: the ratio's interval reaches down to 1, so nothing is refused. Slower on every call: refused."""
    stalled = performance(steady(210.0, stalls=5), steady(200.0))
    assert stalled.details["p99_ratio"] > 40 and stalled.details["p99_ratio_interval"]["low"] < 2.0
    assert stalled.gate.status == "pass", stalled.gate.reasons
    slower = performance(steady(210.0 * 3), steady(200.0), max_ratio=2.0)
    assert slower.gate.status == "fail" and "bless.max_latency_ratio 2" in slower.gate.reasons[0]


def measured(reports: list[StageReport]):
    """A measurement per call: the reports in turn."""
    calls = iter(reports)
    return lambda: (None, next(calls))


def test_a_latency_failure_stands_only_when_a_second_measurement_confirms_it():
    slow, fast = performance(steady(900.0), steady(200.0)), performance(steady(210.0), steady(200.0))
    _, report = confirmed(measured([slow, fast]))
    assert report.gate.status == "pass" and "passed when measured again" in report.headline
    assert "4.5x the champion's" in report.details["first_measurement_failed"][0]
    _, report = confirmed(measured([slow, performance(steady(900.0), steady(200.0))]))   # slower both times
    assert report.gate.status == "fail" and report.details["first_measurement_failed"]
    _, report = confirmed(measured([performance(steady(210.0), steady(200.0))]))   # a pass is measured once
    assert report.gate.status == "pass" and "first_measurement_failed" not in report.details


def answers(ms: list[float], ok: list[bool], labels: list[str] | None = None,
            noop_ms: list[float] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"index": range(len(ms)), "ok": ok, "ms": ms,
                         "label": labels or ["yes" if good else None for good in ok],
                         "noop_ms": noop_ms or [1.0] * len(ms)})


@pytest.mark.parametrize("ms, ok, status, words", [
    ([5.0] * 100, [True] * 100, "pass", "p99 5.0 ms within"),
    ([5.0] * 90 + [300.0] * 10, [True] * 100, "fail", "exceeds slo.p99_ms 100"),
    ([5.0] * 100, [True] * 97 + [False] * 3, "fail", "error rate 3.00% exceeds slo.max_error_rate 1.00%"),
])
def test_service_is_judged_against_the_slo(ms, ok, status, words):
    result = judge_service(load_figures(answers(ms, ok), ["yes"] * 100, 100, 4, 1.0, 300), SloParams(p99_ms=100))
    assert result.status == status and words in result.reasons[0], result


def test_a_busy_box_that_slows_the_no_op_path_as_much_does_not_fail_the_model():
    """/predict's p99 beyond the objective, and the service's own no-op path as slow in the same seconds: the box,
    not the model. The model's share is what /predict adds beyond the no-op."""
    stalls = [5.0] * 90 + [300.0] * 10
    busy = load_figures(answers(stalls, [True] * 100, noop_ms=list(reversed(stalls))), ["yes"] * 100, 100, 4, 1.0, 300)
    result = judge_service(busy | {"load": {"cores": 2, "load_1m": 6.2, "busy_share": 1.0}}, SloParams(p99_ms=100))
    assert result.status == "pass", result.reasons
    assert "is the machine's, not the model's" in result.reasons[0] and "load 6.2 on 2 cores" in result.reasons[0]


def test_a_slow_model_is_refused_when_the_no_op_queues_behind_it_on_a_saturated_box():
    """A model that alone takes twice the objective, while one no-op waits behind its work: the p99s' difference
    is under the objective, but every request pays the model's 200 ms beyond the no-op right after it."""
    queued = load_figures(answers([210.0] * 60, [True] * 60, noop_ms=[10.0] * 59 + [400.0]), ["yes"] * 60, 60, 4,
                          1.0, 300)
    assert queued["model_p99"]["low"] < 100 < queued["model_p50"]["low"]
    result = judge_service(queued, SloParams(p99_ms=100))
    assert result.status == "fail" and "the median request took 200.0 ms more" in result.reasons[0], result


def test_a_slow_model_is_refused_by_its_own_time_when_every_no_op_waits_behind_it():
    """Four clients, the model scored on the service's event loop: each no-op waits behind another client's 200 ms
    request, so neither the p99s nor the pairs tell the model from the box; the service's own time on each does."""
    behind = answers([420.0, 410.0] * 30, [True] * 60, noop_ms=[400.0, 415.0] * 30)
    queued = load_figures(behind.assign(served_ms=[205.0, 212.0] * 30), ["yes"] * 60, 60, 4, 1.0, 300)
    assert queued["model_p99"]["low"] < 100 and queued["model_p50"]["low"] < 100 < queued["served_p50"]["low"]
    result = judge_service(queued, SloParams(p99_ms=100))
    assert result.status == "fail" and "the service itself took a median 208.5 ms" in result.reasons[0], result
    quick = load_figures(behind.assign(served_ms=[3.0] * 60), ["yes"] * 60, 60, 4, 1.0, 300)
    assert judge_service(quick, SloParams(p99_ms=100)).status == "pass"   # the box's wait, not the model's


def test_a_p99_within_the_objective_is_never_refused_whatever_the_no_op_path_took():
    quick = load_figures(answers([5.0] * 100, [True] * 100, noop_ms=[900.0] * 100), ["yes"] * 100, 100, 4, 1.0, 300)
    assert judge_service(quick, SloParams(p99_ms=10)).status == "pass"


def test_service_warns_when_it_answers_differently_from_the_file():
    found = load_figures(answers([5.0] * 4, [True] * 4, ["yes", "no", "yes", "yes"]), ["yes"] * 4, 4, 1, 1.0, 300)
    assert found["disagreements"] == 1 and judge_service(found, SloParams()).status == "warn"


# --- the order -------------------------------------------------------------------------------------------------

def stage(name: str, status: str, calls: list[str]):
    def run() -> StageReport:
        calls.append(name)
        return StageReport(stage=name, gate=GateResult(gate=name, status=status, reasons=[f"{name} {status}"]))
    return run


def test_stages_stop_at_the_first_failure_and_combine_into_one_gate():
    calls: list[str] = []
    reports = run_stages([stage("quality", "warn", calls), stage("performance", "fail", calls),
                          stage("service", "pass", calls)])
    assert calls == ["quality", "performance"]
    gate = combine(reports)
    assert gate.status == "fail" and gate.reasons == ["performance: performance fail", "quality: quality warn"]
    calls.clear()
    passed = combine(run_stages([stage(s, "pass", calls) for s in ("quality", "performance", "service")]))
    assert passed.status == "pass" and len(passed.reasons) == 3 and calls == ["quality", "performance", "service"]


def stage_report(name: str, status: str, outcome: BlessOutcome | None = None) -> StageReport:
    return StageReport(stage=name, gate=GateResult(gate=name, status=status), outcome=outcome)


def test_the_outcome_is_the_first_failed_stage_or_else_quality_decision():
    better = stage_report("quality", "pass", BlessOutcome.BETTER)
    slower, down = stage_report("performance", "fail"), stage_report("service", "fail")
    served, warned = stage_report("service", "pass"), stage_report("performance", "warn")
    assert combine_outcomes([better, warned, served]) is BlessOutcome.BETTER
    assert combine_outcomes([better, slower]) is BlessOutcome.PERFORMANCE_FAILED
    assert combine_outcomes([better, stage_report("performance", "pass"), down]) is BlessOutcome.SERVICE_FAILED
    assert combine_outcomes([stage_report("quality", "fail", BlessOutcome.INCOMPARABLE)]) is BlessOutcome.INCOMPARABLE


# --- real models: shuffled labels never blessed, a better model is --------------------------------------------

def holdout_predictions(encoded, labels: torch.Tensor, params) -> tuple[torch.nn.Module, np.ndarray]:
    """A tiny model trained in-process on `labels`, and its predicted classes on the holdout."""
    torch.manual_seed(0)
    spec = model_spec(params)
    model = build_model(spec["name"], encoded.layout, **spec["kwargs"])
    model, _ = train_model(model, Split(encoded.train.features, labels), encoded.val, params)
    holdout = encode_split(encoded.prepared.holdout, encoded.prepared.schema)
    return model, predict_logits(model, holdout.features).argmax(1).numpy()


@pytest.fixture(scope="module")
def trained(encoded, tiny_train) -> dict:
    prepared = encoded.prepared
    shuffled = encoded.train.labels[torch.randperm(len(encoded.train.labels),
                                                   generator=torch.Generator().manual_seed(0))]
    good_model, good = holdout_predictions(encoded, encoded.train.labels, tiny_train.model_copy(update={"epochs": 12}))
    _, noise = holdout_predictions(encoded, shuffled, tiny_train)
    labels = encode_split(prepared.holdout, prepared.schema).labels.numpy()
    baselines = fit_baselines(prepared.train, prepared.holdout, prepared.schema, BaselineParams(), add_balanced=True)
    return {"labels": labels, "good": good, "noise": noise, "baselines": baselines, "model": good_model}


def predictions(encoded, trained, candidate: str, champion: str | None) -> HoldoutPredictions:
    return HoldoutPredictions(encoded.prepared.holdout, trained["labels"], trained[candidate],
                              trained[champion] if champion else None, encoded.prepared.schema.classes)


def test_a_candidate_trained_on_shuffled_labels_is_never_blessed(encoded, trained):
    first = assess_quality(predictions(encoded, trained, "noise", None), RULES, baselines=trained["baselines"])
    assert first.gate.status == "fail" and first.gate.reasons[0].startswith("worse than a few lines of scikit-learn")
    assert first.outcome is BlessOutcome.BELOW_BASELINES
    # With the baseline gate off, the champion comparison alone refuses it.
    against = assess_quality(predictions(encoded, trained, "noise", "good"), RULES, "1")
    assert against.gate.status == "fail" and against.gate.reasons[0].startswith("regression beyond"), against.gate
    assert against.outcome is BlessOutcome.REGRESSION
    assert against.details["gain"]["high"] < 0


def test_a_better_candidate_is_blessed_and_claimed_better(encoded, trained):
    report = assess_quality(predictions(encoded, trained, "good", "noise"), RULES, "1", baselines=trained["baselines"])
    assert report.gate.status == "pass" and report.gate.reasons[0].startswith("better: f1_macro"), report.gate
    assert report.outcome is BlessOutcome.BETTER
    assert report.details["gain"]["low"] > 0
    assert report.details["slices"]["plan"]["slices"]   # the default slice column of the synthetic table


def test_the_candidate_file_is_served_and_judged_in_the_real_service(encoded, trained, tmp_path):
    from tasks.variants.exporters import export_onnx

    schema = encoded.prepared.schema
    path = tmp_path / "candidate.onnx"
    export_onnx(trained["model"], schema, "legacy", path)
    payloads, positions = request_rows(encoded.prepared.holdout, schema.feature_names, 40)
    expected = [schema.classes[i] for i in trained["good"][positions]]
    report = try_in_service(path, "bless-test", payloads, expected, SloParams(p99_ms=1000, bless_requests=40), 60)
    assert report.gate.status == "pass", report.gate
    assert report.details["answered"] == 40 and report.details["disagreements"] == 0
    assert report.details["reference_p99_ms"] > 0 and "model_p99" in report.details   # the no-op path beside it
    assert report.details["load"]["cores"] >= 1
