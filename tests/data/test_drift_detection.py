"""Does the drift gate detect drift, and only drift? The real measure_drift + judge with the default
MonitorParams (Evidently 0.7 DataDriftPreset; a window counts as drifted at >= 30% drifted features or a
drifted prediction column) on windows of W = 500 served rows against a reference of 5,000 rows of the
synthetic generator (seed 1).

- no-drift traffic: 20 disjoint windows of held-out rows (seed 2, rows the reference never saw): at most 1 fails;
- traffic at data.drift = 0.3 (seed 3): every one of 5 windows fails;
- detection delay: 500 clean rows, then drifted ones, arriving in requests of 10 rows; the newest W rows are
  judged after every K = 3 requests; the delay is the requests after the change point until the first window
  that fails (printed, and attached to the test report as `detection_delay_requests`).

The prediction column is a fixed deterministic stand-in for the model, the same rule on reference and window
(`yes` when support_calls > 2), so the prediction drifts only as much as its inputs do, as a model's would."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.core.params_spec import MonitorParams
from tasks.core.schema_spec import Feature, Schema
from tasks.modalities.table.sources import SYNTHETIC_TARGET, generate_customers
from tasks.monitoring.drift import evidently_report, judge, measure_drift, report_drifts
from tasks.core.servelog import PREDICTION

W = 500               # rows per judged window
REFERENCE_ROWS = 5000
REQUEST_ROWS = 10     # rows per request in the delay stream
K = 3                 # requests between two judgements in the delay stream
# Measured 23-31 requests (seeds 10-15, K = 1): about half the window must have turned over before >= 30% of
# the features cross Evidently's thresholds. 40 requests (400 rows, 80% of the window) leaves that margin, and
# stays below the 50 requests that replace the whole window (a fully drifted window always fails, test 2).
MAX_DELAY_REQUESTS = 40
RULES = MonitorParams()


def with_prediction(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[SYNTHETIC_TARGET]).assign(
        **{PREDICTION: np.where(frame["support_calls"] > 2, "yes", "no")})


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    return with_prediction(generate_customers(REFERENCE_ROWS, seed=1))


@pytest.fixture(scope="module")
def schema(reference: pd.DataFrame) -> Schema:
    features = [Feature(name=c, kind="numeric" if pd.api.types.is_numeric_dtype(reference[c]) else "categorical")
                for c in reference.columns if c != PREDICTION]
    return Schema(source="synthetic", target=SYNTHETIC_TARGET, classes=["no", "yes"], features=features)


def judged(reference: pd.DataFrame, window: pd.DataFrame, schema: Schema):
    findings, _ = measure_drift(reference, window.reset_index(drop=True), schema, RULES)
    return judge(findings, RULES), findings


def windows(frame: pd.DataFrame) -> list[pd.DataFrame]:
    return [frame.iloc[i:i + W] for i in range(0, len(frame), W)]


def test_no_drift_traffic_raises_drift_in_at_most_one_of_20_windows(reference, schema, record_property):
    held_out = with_prediction(generate_customers(20 * W, seed=2))
    results = [judged(reference, window, schema) for window in windows(held_out)]
    failed = [i for i, (gate, _) in enumerate(results) if gate.status == "fail"]
    shares = [round(findings.drifted_share, 2) for _, findings in results]
    record_property("no_drift_false_alarms", len(failed))
    print(f"no drift: {len(failed)} of 20 windows of {W} rows failed; drifted shares {shares}")
    assert len(results) == 20
    assert len(failed) <= 1, [results[i][0].reasons for i in failed]


def test_traffic_at_drift_0_3_is_detected_in_every_window(reference, schema, record_property):
    drifted = with_prediction(generate_customers(5 * W, seed=3, drift=0.3))
    results = [judged(reference, window, schema) for window in windows(drifted)]
    shares = [round(findings.drifted_share, 2) for _, findings in results]
    record_property("drift_0_3_drifted_shares", shares)
    print(f"drift 0.3: drifted shares {shares} (gate fails at >= {RULES.max_drifted_share})")
    assert len(results) == 5
    assert all(gate.status == "fail" for gate, _ in results), [(gate.status, gate.reasons) for gate, _ in results]


def test_detection_delay_after_the_change_point_is_bounded(reference, schema, record_property):
    clean = with_prediction(generate_customers(W, seed=4))
    drifted = with_prediction(generate_customers(W, seed=5, drift=0.3))
    stream = pd.concat([clean, drifted], ignore_index=True)
    change = len(clean)   # the first drifted row
    gate, _ = judged(reference, stream.iloc[change - W:change], schema)
    assert gate.status != "fail", f"the window before the change point already fails: {gate.reasons}"
    delay = None
    for requests in range(K, len(drifted) // REQUEST_ROWS + 1, K):
        end = change + requests * REQUEST_ROWS
        gate, findings = judged(reference, stream.iloc[end - W:end], schema)
        if gate.status == "fail":
            delay = requests
            break
    record_property("detection_delay_requests", delay)
    print(f"detection delay: {delay} requests of {REQUEST_ROWS} rows after the change point "
          f"(window {W} rows, judged every {K} requests)"
          + (f"; {findings.drifted_features()} drifted" if delay is not None else ""))
    assert delay is not None, f"no window failed within {len(drifted)} drifted rows"
    assert delay <= MAX_DELAY_REQUESTS, f"detected {delay} requests after the change, bound {MAX_DELAY_REQUESTS}"


def test_the_verdict_agrees_with_the_html_report_column_by_column(reference, schema):
    """The verdict runs Evidently's per-column test without its plots; the saved report (DataDriftPreset) draws
    them: on a drifted window both name the same test, threshold, score and decision for every column."""
    window = with_prediction(generate_customers(W, seed=4, drift=0.3))
    findings, samples = measure_drift(reference, window, schema, RULES)
    drawn = report_drifts(evidently_report(samples, schema))
    assert set(drawn) == set(findings.features) | {PREDICTION}
    for name, verdict in {**findings.features, PREDICTION: findings.prediction}.items():
        assert (verdict.method, verdict.threshold, verdict.drifted) == (drawn[name].method, drawn[name].threshold,
                                                                        drawn[name].drifted), name
        assert verdict.score == pytest.approx(drawn[name].score, rel=1e-12, abs=1e-12), name
    assert any(column.drifted for column in findings.features.values())
