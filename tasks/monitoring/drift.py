"""Drift of a window against the reference, by Evidently 0.7: per-feature drift and prediction drift
(Evidently's own choice of test per column), accuracy on feedback-labelled rows against the serving version's
accuracy on the holdout, and beside it the label-free estimate of accuracy (tasks/monitoring/estimate.py). Each
side is a seeded sample of at most `sample_rows`: the tests' power depends on the sample, not the log's size, so
the monitor's time stays flat as the log grows (bench/bench_monitor.py shows the figures and that detection holds).

The verdict and the report are apart on purpose. Evidently draws every plot while it computes a Report (~90% of a
DataDriftPreset's time), so the verdict calls the per-column test its ValueDrift metric calls
(`get_one_column_drift`, same test, same threshold, same score), and the HTML report (DataDriftPreset over the
same two samples) is drawn only where it is saved (tests/data/test_drift_detection.py checks both agree).

One test is ours, not Evidently's choice: the prediction column's. Evidently's chi-square compares the window's
class counts with the reference's as if those were exact proportions, so a small reference (an image set's
validation split) raises drift on clean traffic (67% of clean windows at 10 classes and 300 reference rows, in a
simulation). The two-sample chi-square on the 2 x classes table counts both samples' noise; both the verdict and
the report use it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel

from tasks.core.artifacts import write_atomic
from tasks.core.gate import GateResult
from tasks.core.params_spec import MonitorParams
from tasks.core.runtime import EMBEDDING
from tasks.core.schema_spec import Schema
from tasks.core.servelog import PREDICTION
from tasks.modalities import modality_of
from tasks.monitoring.embeddings import EMBEDDING_METHOD, embedding_drift, embeddings_report, spread_embeddings
from tasks.monitoring.estimate import Estimate, Holdout, estimate_window

EMBEDDING_REPORT_ROWS = 300


class ColumnDrift(BaseModel):
    method: str
    score: float
    threshold: float
    drifted: bool


class Quality(BaseModel):
    labelled: int
    accuracy: float
    reference_accuracy: float    # the serving version on the holdout, scored now
    drop: float


class DriftFindings(BaseModel):
    window_rows: int
    reference_rows: int
    sampled: int                 # rows per side Evidently saw
    features: dict[str, ColumnDrift]
    drifted_share: float
    prediction: ColumnDrift | None = None
    quality: Quality | None = None
    estimate: Estimate | None = None   # label-free, from the served probabilities of the sampled window rows

    def drifted_features(self) -> list[str]:
        return [name for name, column in self.features.items() if column.drifted]


def typed_like(window: pd.DataFrame, schema: Schema) -> pd.DataFrame:
    """Logged rows hold JSON values: numbers back to floats (text that is not a number -> missing), categories
    to text, as the reference holds them."""
    typed = {}
    for feature in schema.features:
        values = window[feature.name] if feature.name in window else pd.Series([None] * len(window))
        if feature.kind == "numeric":
            typed[feature.name] = pd.to_numeric(values, errors="coerce").astype(float)
        else:
            typed[feature.name] = values.astype(object).where(values.notna(), None).map(
                lambda v: None if v is None else str(v).strip())
    return pd.DataFrame(typed, index=window.index)


def sample(frame: pd.DataFrame, rows: int, seed: int) -> pd.DataFrame:
    return frame if len(frame) <= rows else frame.sample(n=rows, random_state=seed)


def drift_columns(schema: Schema) -> tuple[list[str], list[str]]:
    """(numeric, categorical) columns Evidently compares: the features, and the prediction as a category."""
    numeric = [f.name for f in schema.features if f.kind == "numeric"]
    return numeric, [f.name for f in schema.features if f.kind == "categorical"] + [PREDICTION]


PREDICTION_TEST = "two-sample chi-square p_value"   # its name and display name: the report shows it


def two_sample_chisquare(reference: pd.Series, current: pd.Series, feature_type, threshold: float
                         ) -> tuple[float, bool]:
    """Evidently's stat-test signature: the p-value of a chi-square test of independence on the (2, values)
    table of counts (both samples are samples), and whether it is below `threshold`."""
    from scipy.stats import chi2_contingency

    values = sorted(set(reference.dropna()) | set(current.dropna()), key=str)
    table = np.array([[int((sample == value).sum()) for value in values] for sample in (reference, current)])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or (table.sum(axis=1) == 0).any():
        return 1.0, False
    p_value = float(chi2_contingency(table)[1])
    return p_value, p_value < threshold


def prediction_test():
    """The prediction column's StatTest, registered with Evidently on first use (never at import time)."""
    from evidently.legacy.calculations.stattests.registry import StatTest, register_stattest
    from evidently.legacy.core import ColumnType

    global _PREDICTION_STATTEST
    if _PREDICTION_STATTEST is None:
        _PREDICTION_STATTEST = StatTest(name=PREDICTION_TEST, display_name=PREDICTION_TEST,
                                        allowed_feature_types=[ColumnType.Categorical], default_threshold=0.05)
        register_stattest(_PREDICTION_STATTEST, default_impl=two_sample_chisquare)
    return _PREDICTION_STATTEST


_PREDICTION_STATTEST = None


class DriftSamples(BaseModel):
    """The two typed samples a verdict was made on: what the HTML report is drawn from."""

    model_config = {"arbitrary_types_allowed": True}
    reference: pd.DataFrame
    current: pd.DataFrame


def evidently_report(samples: DriftSamples, schema: Schema):
    """The Evidently snapshot: DataDriftPreset over the features (an image's statistics) and the prediction column
    (with its plots)."""
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    numeric, categorical = drift_columns(modality_of(schema).watched(schema))
    definition = DataDefinition(numerical_columns=numeric, categorical_columns=categorical)
    columns = numeric + categorical
    return Report([DataDriftPreset(columns=columns, per_column_method={PREDICTION: prediction_test()})]).run(
        reference_data=Dataset.from_pandas(samples.reference[columns], data_definition=definition),
        current_data=Dataset.from_pandas(samples.current[columns], data_definition=definition))


def report_drifts(snapshot) -> dict[str, ColumnDrift]:
    """A snapshot's ValueDrift metrics as {column: ColumnDrift} (the report holds numpy scalars: go through JSON)."""
    found = {}
    for metric in json.loads(snapshot.json())["metrics"]:
        if metric["metric_name"].startswith("ValueDrift"):
            config = metric["config"]
            score, threshold = float(metric["value"]), float(config["threshold"])
            method = str(config["method"])
            # p-value tests drift below the threshold, distances above it
            drifted = score < threshold if "p_value" in method or "test" in method.lower() else score >= threshold
            found[config["column"]] = ColumnDrift(method=method, score=score, threshold=threshold, drifted=drifted)
    return found


def column_drifts(samples: DriftSamples, schema: Schema) -> dict[str, ColumnDrift]:
    """Per column, the test Evidently's ValueDrift metric runs (its automatic choice of test and threshold, as
    DataDriftPreset leaves them), without drawing its plot."""
    from evidently.legacy.calculations.data_drift import get_one_column_drift
    from evidently.legacy.core import ColumnType
    from evidently.legacy.metric_results import DatasetColumns, DatasetUtilityColumns
    from evidently.legacy.options.data_drift import DataDriftOptions

    numeric, categorical = drift_columns(schema)
    options, found = DataDriftOptions(per_feature_stattest={PREDICTION: prediction_test()}), {}
    for column in numeric + categorical:
        kind = ColumnType.Numerical if column in numeric else ColumnType.Categorical
        columns = DatasetColumns(
            utility_columns=DatasetUtilityColumns(date=None, id=None, target=None, prediction=None),
            target_type=None, task=None, num_feature_names=[column] if column in numeric else [],
            cat_feature_names=[column] if column in categorical else [], text_feature_names=[],
            datetime_feature_names=[], target_names=None)
        drift = get_one_column_drift(current_data=samples.current[[column]], reference_data=samples.reference[[column]],
                                     column_name=column, options=options, dataset_columns=columns, column_type=kind,
                                     agg_data=True)
        found[column] = ColumnDrift(method=drift.stattest_name, score=float(drift.drift_score),
                                    threshold=float(drift.stattest_threshold), drifted=bool(drift.drift_detected))
    return found


def measure_drift(reference: pd.DataFrame, window: pd.DataFrame, schema: Schema, rules: MonitorParams,
                  holdout: Holdout | None = None) -> tuple[DriftFindings, DriftSamples]:
    """Pure core: `reference` holds the features and the serving version's predictions on them; `window`
    holds the served rows (features, prediction, logged probabilities, and `label` where feedback came); with
    `holdout`, accuracy on the labelled rows and the label-free estimate are held to its accuracy."""
    # Sample first, then type: typing is per value, so typing only the sample keeps the time flat in the log size.
    current_raw = sample(window, rules.sample_rows, rules.seed)
    reference_raw = sample(reference, rules.sample_rows, rules.seed)
    watched = modality_of(schema).watched(schema)   # the columns the request log keeps of each item
    current_sample = typed_like(current_raw, watched).assign(**{PREDICTION: current_raw[PREDICTION].astype(str).values})
    reference_sample = typed_like(reference_raw, watched).assign(
        **{PREDICTION: reference_raw[PREDICTION].astype(str).values})
    embedded = EMBEDDING in reference_raw.columns   # the model's own embedding projection, one column per dimension
    if embedded:
        current_sample = current_sample.join(spread_embeddings(current_raw[[EMBEDDING]]))
        reference_sample = reference_sample.join(spread_embeddings(reference_raw[[EMBEDDING]]))
    samples = DriftSamples(reference=reference_sample, current=current_sample)
    columns = column_drifts(samples, watched)
    features = {f.name: columns[f.name] for f in watched.features if f.name in columns}
    if embedded:
        score, chance, drifted = embedding_drift(samples.reference, samples.current, rules.seed)
        features[EMBEDDING] = ColumnDrift(method=EMBEDDING_METHOD, score=score, threshold=chance, drifted=drifted)
    quality = None
    labelled = window[window["label"].notna()] if "label" in window else window.iloc[:0]
    if holdout is not None and len(labelled) >= rules.min_labelled:
        accuracy = float((labelled["label"].astype(str) == labelled[PREDICTION].astype(str)).mean())
        quality = Quality(labelled=len(labelled), accuracy=accuracy, reference_accuracy=holdout.accuracy,
                          drop=holdout.accuracy - accuracy)
    # On the sample Evidently saw: at sample_rows rows its standard error is a fraction of a point.
    estimate = estimate_window(current_raw, schema.classes, holdout) if holdout is not None else None
    findings = DriftFindings(window_rows=len(window), reference_rows=len(reference),
                             sampled=len(current_sample), features=features,
                             drifted_share=float(np.mean([c.drifted for c in features.values()])) if features else 0.0,
                             prediction=columns.get(PREDICTION), quality=quality, estimate=estimate)
    return findings, samples


def judge(findings: DriftFindings, rules: MonitorParams, evidence: str | None = None) -> GateResult:
    """The drift gate: fail = material drift (a retrain is warranted); warn = some drift below the bar."""
    failures, warnings = [], []
    drifted = findings.drifted_features()
    share = f"{len(drifted)} of {len(findings.features)} features drifted ({findings.drifted_share:.0%})"
    if findings.drifted_share >= rules.max_drifted_share:
        failures.append(f"{share} >= {rules.max_drifted_share:.0%}: {', '.join(drifted)}")
    elif drifted:
        warnings.append(f"{share} < {rules.max_drifted_share:.0%}: {', '.join(drifted)}")
    if findings.prediction is not None and findings.prediction.drifted:
        line = (f"prediction drift {findings.prediction.score:.3f} ({findings.prediction.method}, "
                f"threshold {findings.prediction.threshold})")
        (failures if rules.prediction_drift else warnings).append(line)
    if findings.quality is not None and findings.quality.drop > rules.max_quality_drop:
        failures.append(f"accuracy on {findings.quality.labelled} labelled rows {findings.quality.accuracy:.3f} is "
                        f"{findings.quality.drop:.3f} below the holdout's {findings.quality.reference_accuracy:.3f} "
                        f"(> {rules.max_quality_drop})")
    estimate = findings.estimate
    if estimate is not None and estimate.drop > rules.max_estimated_drop:
        # a gate input like the others; a retrain it starts still needs new labels (retrain.min_new_labels)
        failures.append(f"estimated accuracy (label-free) {estimate.accuracy:.3f} ± {estimate.standard_error:.3f} on "
                        f"{estimate.rows} rows is {estimate.drop:.3f} below the holdout's "
                        f"{estimate.reference_accuracy:.3f} (> {rules.max_estimated_drop})")
    passed = f"no drift: {share}" + (f", accuracy {findings.quality.accuracy:.3f} on {findings.quality.labelled} "
                                      "labelled rows" if findings.quality else "") + (
        f", estimated accuracy {estimate.accuracy:.3f} (holdout {estimate.reference_accuracy:.3f})" if estimate else "")
    return GateResult.decide("drift", failures, warnings, evidence=evidence, passed=passed)


def save_html(samples: DriftSamples, schema: Schema, path: Path) -> Path:
    """The Evidently HTML report of the samples a verdict was made on (drawn here, not in the verdict); for images
    also Evidently's EmbeddingsDrift report beside it (`<name>-embeddings.html`, on at most EMBEDDING_REPORT_ROWS a
    side: its t-SNE plot grows with the square of the rows)."""
    snapshot = evidently_report(samples, schema)
    write_atomic(path, lambda tmp: snapshot.save_html(str(tmp)))
    if any(column.startswith(f"{EMBEDDING}_") for column in samples.reference.columns):
        embeddings = embeddings_report(sample(samples.reference, EMBEDDING_REPORT_ROWS, 0),
                                       sample(samples.current, EMBEDDING_REPORT_ROWS, 0))
        write_atomic(path.with_name(f"{path.stem}-embeddings.html"), lambda tmp: embeddings.save_html(str(tmp)))
    return path
