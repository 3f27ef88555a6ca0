"""The progressive canary's pure core (tasks/canary/analysis.py) and what it reads of a service
(tasks/canary/observe.py): PSI, the histogram quantile, the step verdict, the metrics delta, paired rows, the
champion's smoke test, the pipeline's verdict from the canary's outcome; and the service's sticky split
(serving/variants.py)."""
from __future__ import annotations

import math

import pytest

from serving.variants import Router, sticky_bucket
from tasks.canary.analysis import histogram_quantile, judge_smoke, judge_step, psi
from tasks.canary.observe import Scrape, StepLogs, smoke_figures, step_figures
from tasks.core.gate import GateResult
from tasks.core.params_spec import CanaryParams
from tasks.core.verdicts import (
    Blessing,
    BlessOutcome,
    CanaryOutcome,
    CanaryReport,
    PairedRows,
    Registration,
    RegistrationOutcome,
    VariantFigures,
)

RULES = CanaryParams(min_samples=20, max_error_rate=0.0, max_p95_ratio=3.0, p95_slack_ms=5.0, max_psi=0.2,
                     max_metric_drop=0.02)


def figures(version="1", requests=100, errors=0, p95=2.0, labels=None, labelled=100, correct=80) -> VariantFigures:
    return VariantFigures(version=version, requests=requests, errors=errors, p95_ms=p95,
                          labels=labels or {"no": 70, "yes": 30}, labelled=labelled, correct=correct)


def test_psi_is_zero_for_equal_distributions_and_grows_with_the_shift():
    assert psi({"a": 70, "b": 30}, {"a": 7, "b": 3}) == pytest.approx(0.0)
    by_hand = (0.5 - 0.7) * math.log(0.5 / 0.7) + (0.5 - 0.3) * math.log(0.5 / 0.3)
    assert psi({"a": 70, "b": 30}, {"a": 50, "b": 50}) == pytest.approx(by_hand)
    assert psi({"a": 70, "b": 30}, {"b": 100}) > psi({"a": 70, "b": 30}, {"a": 50, "b": 50}) > 0
    assert psi({}, {"a": 1}) is None


def test_histogram_quantile_interpolates_within_the_bucket_like_prometheus():
    buckets = [(0.001, 50.0), (0.005, 90.0), (0.01, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.005 + 0.005 * (95 - 90) / 10)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert histogram_quantile(0.95, [(0.001, 0.0), (math.inf, 0.0)]) is None


def test_an_equal_challenger_passes():
    verdict = judge_step("25%", 0.25, figures(), figures(version="2"), RULES, pairs=SAME)
    assert verdict.status == "pass" and verdict.psi == pytest.approx(0.0), verdict.reasons
    assert "accuracy 0.800 vs champion's 0.800 on 100 labelled pairs: drop +0.000" in verdict.reasons[0]


SAME = PairedRows(rows=100, classes={"no": {"no": 70}, "yes": {"yes": 30}}, labelled=100, champion_only=5,
                  challenger_only=5)


@pytest.mark.parametrize("challenger, pairs, words", [
    (figures(version="2", errors=1), SAME, "error rate"),
    (figures(version="2", p95=20.0), SAME, "p95 latency"),
    (figures(version="2", labels={"yes": 100}),
     SAME.model_copy(update={"classes": {"no": {"yes": 70}, "yes": {"yes": 30}}}), "PSI"),
    (figures(version="2", correct=60), SAME.model_copy(update={"champion_only": 20, "challenger_only": 0}),
     "accuracy")])
def test_each_check_fails_a_step_on_its_own(challenger, pairs, words):
    verdict = judge_step("5%", 0.05, figures(), challenger, RULES, pairs=pairs)
    assert verdict.status == "fail" and len(verdict.reasons) == 1 and words in verdict.reasons[0], verdict.reasons


def test_a_quality_figure_beyond_its_threshold_but_not_significant_asks_for_more_rows():
    """Ten rows out of 100 more against the challenger than for it: a drop of 0.10 > 0.02, p 0.02: not at this
    canary's level; and 5 of 100 rows moved to a class the champion never predicts (PSI over 0.2): as likely one
    way as the other if the two were alike, so noise on 100 rows."""
    drop = SAME.model_copy(update={"champion_only": 12, "challenger_only": 2})
    verdict = judge_step("5%", 0.05, figures(), figures(version="2", correct=70), RULES, pairs=drop)
    assert verdict.status == "short" and "more labelled pairs needed" in verdict.reasons[0], verdict.reasons
    assert verdict.statistics.drop == pytest.approx(0.10) and verdict.statistics.drop_p > verdict.statistics.alpha
    moved = SAME.model_copy(update={"classes": {"no": {"no": 95, "yes": 5}}, "rows": 100})
    noisy = judge_step("5%", 0.05, figures(labels={"no": 100}), figures(version="2", labels={"no": 95, "yes": 5}),
                       RULES, pairs=moved)
    assert noisy.psi > RULES.max_psi and noisy.status == "short" and "not significant" in noisy.reasons[0], \
        noisy.reasons
    # the same figures on rows nobody paired are not judged either: short, never a rollback
    assert judge_step("5%", 0.05, figures(), figures(version="2", labels={"yes": 100}), RULES).status == "short"


def test_latency_within_the_slack_or_the_ratio_passes():
    assert judge_step("5%", 0.05, figures(p95=0.5), figures(version="2", p95=4.0), RULES).status == "pass"
    assert judge_step("5%", 0.05, figures(p95=10.0), figures(version="2", p95=25.0), RULES).status == "pass"


def test_too_few_samples_is_short_not_judged():
    verdict = judge_step("5%", 0.05, figures(), figures(version="2", requests=19, errors=19), RULES)
    assert verdict.status == "short" and "19 of the 20" in verdict.reasons[0]


def test_at_full_share_the_champion_latency_of_an_earlier_step_is_the_reference():
    idle_champion = figures(requests=0, p95=None)
    slow = figures(version="2", p95=30.0)
    assert judge_step("100%", 1.0, idle_champion, slow, RULES, champion_p95_ms=2.0).status == "fail"
    assert judge_step("100%", 1.0, idle_champion, slow, RULES, champion_p95_ms=None).status == "pass"


def scrape(ok: float, errors: float, slow_bucket: float) -> Scrape:
    return Scrape({("challenger", "2", "ok"): ok, ("challenger", "2", "error"): errors, ("champion", "1", "ok"): 50.0},
                  {"challenger": {0.001: ok - slow_bucket, 0.1: ok, math.inf: ok}})


def test_step_figures_are_the_delta_of_the_scrapes_and_the_paired_rows():
    before, after = scrape(10, 1, 0), scrape(30, 3, 20)
    line = {"ts": 1.0, "request_id": "r"}
    served = [{**line, "id": f"r{i}", "variant": "challenger", "version": "2", "prediction": "yes"} for i in range(4)]
    shadow = [{**line, "id": f"r{i}", "variant": "champion", "version": "1", "prediction": "no"} for i in range(3)]
    champion, challenger, pairs = step_figures(after.minus(before),
                                               StepLogs(served, shadow, {"r0": "yes", "r1": "no"}), "1", "2",
                                               shadow_phase=False)
    assert (challenger.requests, challenger.errors) == (22, 2)
    assert challenger.p95_ms == pytest.approx(1 + 99 * (19 - 0) / 20)   # all 20 new answers in (1, 100] ms
    assert challenger.labels == {"yes": 3} and champion.labels == {"no": 3}   # r3 has no shadow: unpaired
    assert (challenger.labelled, challenger.correct, champion.correct) == (2, 1, 1)
    assert pairs == PairedRows(rows=3, classes={"no": {"yes": 3}}, labelled=2, champion_only=1, challenger_only=1)


def test_a_replayed_row_counts_once_however_many_ids_it_came_back_under():
    line = {"ts": 1.0, "features": {"age": 40, "plan": "basic"}}
    served = [{**line, "id": f"r{i}", "variant": "champion", "version": "1", "prediction": "no"} for i in range(5)]
    shadow = [{**line, "id": f"r{i}", "variant": "challenger", "version": "2", "prediction": "yes"} for i in range(5)]
    other = {"ts": 1.0, "features": {"age": 41, "plan": "basic"}, "id": "x", "prediction": "no"}
    served.append({**other, "variant": "champion", "version": "1"})
    shadow.append({**other, "variant": "challenger", "version": "2"})
    labels = {f"r{i}": "no" for i in range(5)} | {"x": "no"}
    champion, challenger, pairs = step_figures(Scrape(), StepLogs(served, shadow, labels), "1", "2", shadow_phase=True)
    assert (pairs.rows, pairs.labelled, pairs.champion_only, pairs.challenger_only) == (2, 2, 1, 0)
    assert champion.labels == {"no": 2} and challenger.labels == {"yes": 1, "no": 1} and champion.labelled == 2


def test_smoke_figures_count_every_replayed_request_the_champion_did_not_answer_as_an_error():
    before = Scrape({("champion", "1", "ok"): 5.0}, {"champion": {0.001: 5.0, 0.1: 5.0, math.inf: 5.0}})
    after = Scrape({("champion", "1", "ok"): 12.0, ("champion", "1", "error"): 1.0, ("-", "", "unavailable"): 2.0},
                   {"champion": {0.001: 5.0, 0.1: 12.0, math.inf: 12.0}})
    served = [{"ts": 1.0, "id": f"r{i}", "variant": "champion", "version": "1", "prediction": "no"} for i in range(7)]
    smoke = smoke_figures(after.minus(before), StepLogs(served, [], {"r0": "no", "r1": "yes", "x": "no"}), "1", 10)
    assert (smoke.requests, smoke.errors) == (10, 3)          # 7 answered of the 10 sent: the failed one and two 503s
    assert smoke.p95_ms == pytest.approx(1 + 99 * (6.65 - 0) / 7)   # the 7 new answers, all in (1, 100] ms
    assert smoke.labels == {"no": 7} and (smoke.labelled, smoke.correct) == (2, 1)


def test_the_smoke_test_fails_on_the_error_rate_a_challenger_step_may_not_exceed():
    passed = judge_smoke(figures(requests=60, errors=0, labelled=60, correct=45), RULES)
    assert passed.status == "pass" and passed.reasons == [
        "champion v1 answered 60 requests, 0 errors, p95 2.0 ms, accuracy 0.750 on 60 labelled"]
    failed = judge_smoke(figures(requests=60, errors=1), RULES)
    assert failed.status == "fail" and "failed 1 of 60 replayed requests" in failed.reasons[0], failed.reasons
    tolerant = RULES.model_copy(update={"max_error_rate": 0.05})
    assert judge_smoke(figures(requests=60, errors=1), tolerant).status == "pass"
    assert judge_smoke(figures(requests=0, labelled=0, correct=0), RULES).status == "fail"


@pytest.mark.parametrize("outcome, verdict", [(CanaryOutcome.SMOKE_TESTED, "v2 is challenger; the canary decides"),
                                              (CanaryOutcome.PROMOTED, "the canary's own words")])
def test_the_pipeline_verdict_follows_the_canary_outcome_not_its_wording(outcome, verdict):
    from tasks.stages.summary import summarize

    passed = GateResult(gate="canary", status="pass")
    blessing = Blessing(gate=passed, outcome=BlessOutcome.BETTER, model_name="m", candidate_path="x",
                        candidate_sha256="0", candidate_metrics={})
    registration = Registration(model_name="m", version="2", created=True,
                                outcome=RegistrationOutcome.CHALLENGER, aliases={"champion": "1", "challenger": "2"},
                                action="v2 is challenger; the canary decides")
    report = CanaryReport(gate=passed, outcome=outcome, action="the canary's own words")
    assert summarize([], blessing, registration, report, "run").verdict == verdict


def test_the_split_is_sticky_by_key_as_the_share_grows():
    router = Router(0.05)
    router.champion, router.challenger = object(), object()
    keys = [f"user-{i}".encode() for i in range(2000)]
    on_challenger = {}
    for share in (0.05, 0.25, 0.5):
        router.share = share
        on_challenger[share] = {k for k in keys if router.pick(k) is router.challenger}
    assert on_challenger[0.05] <= on_challenger[0.25] <= on_challenger[0.5]
    assert 0.4 < len(on_challenger[0.5]) / len(keys) < 0.6
    assert all(router.pick(k) is router.challenger for k in on_challenger[0.25])   # the same answer every time
    router.share = 0.0
    assert all(router.pick(k) is router.champion for k in keys)
    assert 0.0 <= sticky_bucket(b"x") < 1.0
