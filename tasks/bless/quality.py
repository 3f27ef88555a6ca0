"""bless, stage 1, quality: the candidate against the scikit-learn baselines and the live champion re-scored now
on the same holdout rows. The bless metric with paired bootstrap intervals of baseline - candidate (a candidate is
refused only when the whole interval lies beyond bless.max_baseline_gap) and of candidate - champion (a gain is
claimed only when the interval lies above 0), metrics per class, and per declared slice."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from tasks.bless.advice import gap_advice
from tasks.core.gate import GateResult
from tasks.core.metrics import classification_metrics, paired_bootstrap, per_class_metrics
from tasks.core.params_spec import BlessParams
from tasks.core.verdicts import BlessOutcome, StageReport

MISSING = "(missing)"


@dataclass(frozen=True)
class HoldoutPredictions:
    """Both models' predicted class indices on the same holdout rows, in the candidate's class order."""

    rows: pd.DataFrame               # the raw holdout rows (slice columns are read from here)
    labels: np.ndarray               # (N,) true class indices
    candidate: np.ndarray            # (N,)
    champion: np.ndarray | None      # (N,), or None: no champion, or not comparable
    classes: list[str]
    baseline: np.ndarray | None = None   # (N,) the gate's baseline's, or None: its report saved none (older)


class QualityVerdict(NamedTuple):
    """The candidate's metrics judged against the baselines and the champion: the decision, and its gate."""

    outcome: BlessOutcome
    gate: GateResult


def gate_baselines(report: dict) -> dict[str, dict[str, float]]:
    """What the baseline stage's `report` holds the candidate to: the baseline cross-validation on the training
    split picked (small tables); else an image model's own linear probes when there are (a fine-tune must beat the
    features it started from, even where the pixel regression scores a little higher); else every baseline (the
    gate takes the best of them on the holdout)."""
    picked = report.get("picked")
    if picked:
        return {picked: report["models"][picked]}
    probes = {name: figures for name, figures in report["models"].items() if name.startswith("linear_probe")}
    return probes or report["models"]


def gate_predictions(saved: dict | None, baselines: dict | None, metric: str, rows: int) -> np.ndarray | None:
    """The gate's baseline's holdout predictions the baseline stage `saved`, when they are the ones to judge with:
    of the best of `baselines` on `metric`, over `rows` holdout rows; None otherwise (an older report, or a
    holdout that changed since), and bless falls back to the point rule."""
    if not saved or not baselines or saved.get("rows") != rows or len(saved.get("predicted", [])) != rows:
        return None
    best = max(baselines, key=lambda name: baselines[name][metric])
    return np.asarray(saved["predicted"], dtype=np.int64) if saved.get("baseline") == best else None


def baseline_gap(predictions: HoldoutPredictions, rules: BlessParams) -> dict[str, float] | None:
    """baseline - candidate on the bless metric with its paired bootstrap interval (the champion comparison's
    resamples, confidence and seed), or None without the baseline's predictions."""
    if predictions.baseline is None:
        return None
    return paired_bootstrap(predictions.labels, predictions.baseline, predictions.candidate, len(predictions.classes),
                            rules.metric, rules.bootstrap, rules.confidence)


def judge_candidate(candidate: dict[str, float], champion: dict[str, float] | None, comparable: bool,
                    rules: BlessParams, champion_version: str | None = None, baselines: dict | None = None,
                    gain: dict | None = None, training: dict | None = None,
                    gap: dict | None = None) -> QualityVerdict:
    """Pure core: fail when the candidate is worse than the best scikit-learn baseline beyond `max_baseline_gap`
    (first model included), naming the knob most likely to help (`training`: how the train stage ran, see
    tasks/bless/advice.py); else pass if there is no champion; else judge candidate - champion on the bless
    metric (`gain`: its paired bootstrap interval, when measured). `gap`: baseline - candidate with its paired
    bootstrap interval; with it the candidate is refused only when the interval's lower bound is beyond the gap
    (one or two holdout rows behind is noise on a small holdout), without it on the point figures."""
    metric = rules.metric
    against_baselines = ""
    if baselines:
        best = max(baselines, key=lambda name: baselines[name][metric])
        behind = gap["difference"] if gap else baselines[best][metric] - candidate[metric]
        interval = (f" ({gap['confidence']:.0%} CI {gap['low']:+.4f} to {gap['high']:+.4f})" if gap else
                    " (a point figure: the baseline stage saved no holdout predictions to bootstrap; re-run it)")
        figures = ", ".join(f"{name.replace('_', ' ')} {b[metric]:.4f}" for name, b in baselines.items())
        if (gap["low"] if gap else behind) > rules.max_baseline_gap:
            return QualityVerdict(BlessOutcome.BELOW_BASELINES, GateResult.decide("bless", [
                f"worse than a few lines of scikit-learn: {metric} {candidate[metric]:.4f} is {behind:.4f} below "
                f"the {best.replace('_', ' ')} baseline {baselines[best][metric]:.4f} on the same holdout"
                f"{interval}, beyond bless.max_baseline_gap {rules.max_baseline_gap} (baselines: {figures}); "
                f"most likely to help: {gap_advice(training, baselines, metric, rules.max_baseline_gap)}"]))
        against_baselines = f"; baselines: {figures}"
        within = "within noise of" if behind > rules.max_baseline_gap else "within"
        against_baselines += (f"; {best.replace('_', ' ')} baseline minus candidate {behind:+.4f}{interval}, "
                              f"{within} bless.max_baseline_gap {rules.max_baseline_gap}")
    if champion is None:
        return QualityVerdict(BlessOutcome.FIRST_MODEL, GateResult.decide(
            "bless", [], passed=f"first model: no champion to compare with ({metric} {candidate[metric]:.4f}"
                                f"{against_baselines})"))
    if not comparable:
        return QualityVerdict(BlessOutcome.INCOMPARABLE, GateResult.decide("bless", [
            f"input signature differs from champion v{champion_version}: not comparable; "
            "register under a new data.model_name or re-baseline explicitly"]))
    return compare_with_champion(candidate, champion, rules, champion_version, gain, against_baselines)


def compare_with_champion(candidate: dict[str, float], champion: dict[str, float], rules: BlessParams,
                          champion_version: str | None, gain: dict | None, note: str = "") -> QualityVerdict:
    """A loss beyond `max_regression` fails, a smaller one warns; "better" only when the interval is above 0."""
    metric = rules.metric
    point = gain["difference"] if gain else candidate[metric] - champion[metric]
    interval = f", {gain['confidence']:.0%} CI {gain['low']:+.4f} to {gain['high']:+.4f}" if gain else ""
    figure = (f"{metric} {candidate[metric]:.4f} vs champion v{champion_version} {champion[metric]:.4f} "
              f"({point:+.4f}{interval}){note}")
    if point < -rules.max_regression:
        return QualityVerdict(BlessOutcome.REGRESSION, GateResult.decide(
            "bless", [f"regression beyond bless.max_regression {rules.max_regression}: {figure}"]))
    if point < 0:
        noise = ", within noise" if gain and gain["high"] >= 0 else ""
        return QualityVerdict(BlessOutcome.WORSE_WITHIN_TOLERANCE, GateResult.decide(
            "bless", [], [f"worse, within bless.max_regression {rules.max_regression}{noise}: {figure}"]))
    if gain and gain["low"] > 0:
        return QualityVerdict(BlessOutcome.BETTER, GateResult.decide("bless", [], passed=f"better: {figure}"))
    return QualityVerdict(BlessOutcome.NO_WORSE, GateResult.decide(
        "bless", [], passed=("no worse, not shown better: " if gain else "no worse: ") + figure))


def slice_groups(column: pd.Series, bins: int) -> dict[str, np.ndarray]:
    """{slice name: row mask}: one slice per category, or `bins` quantile bins of a numeric column; missing
    values are a slice of their own."""
    if pd.api.types.is_numeric_dtype(column) and column.nunique() > bins:
        binned = pd.qcut(column, bins, duplicates="drop")
        labels = {interval: f"{interval.left:.4g}..{interval.right:.4g}" for interval in binned.cat.categories}
        names, order = binned.astype(object).map(labels), list(labels.values())   # bins in ascending order
    else:
        names = column.astype(object).map(str)
        order = sorted(names[column.notna()].unique())
    names = names.where(column.notna(), MISSING)
    order += [MISSING] if column.isna().any() else []
    return {name: (names == name).to_numpy() for name in order if (names == name).any()}


def score_slices(predictions: HoldoutPredictions, rules: BlessParams) -> dict[str, dict]:
    """{column: {slice: rows, both models' metric, and (judged slices) the paired difference}}; a column the
    holdout lacks gets {"skipped": why}."""
    n_classes, metric = len(predictions.classes), rules.metric
    report = {}
    for column in rules.slices:
        if column not in predictions.rows:
            report[column] = {"skipped": "not a column of this holdout"}
            continue
        groups = {}
        for name, mask in slice_groups(predictions.rows[column], rules.slice_bins).items():
            labels, candidate = predictions.labels[mask], predictions.candidate[mask]
            entry = {"rows": int(mask.sum()), "candidate": classification_metrics(labels, candidate, n_classes)[metric]}
            if predictions.champion is not None:
                champion = predictions.champion[mask]
                entry["champion"] = classification_metrics(labels, champion, n_classes)[metric]
                if entry["rows"] >= rules.min_slice_rows:
                    entry.update(paired_bootstrap(labels, candidate, champion, n_classes, metric, rules.bootstrap,
                                                  rules.confidence))
            entry["judged"] = "difference" in entry
            groups[name] = entry
        report[column] = {"kind": "numeric" if pd.api.types.is_numeric_dtype(predictions.rows[column]) else
                          "categorical", "slices": groups}
    return report


def judge_slices(slices: dict[str, dict], rules: BlessParams) -> list[str]:
    """Failures: judged slices where the candidate is worse than the champion beyond `max_slice_regression` and
    the interval lies below 0 (a real loss, not the noise of a small slice)."""
    failures = []
    for column, report in slices.items():
        for name, s in report.get("slices", {}).items():
            if s["judged"] and s["difference"] < -rules.max_slice_regression and s["high"] < 0:
                failures.append(f"slice {column}={name} ({s['rows']} rows): {rules.metric} {s['candidate']:.4f} vs "
                                f"champion {s['champion']:.4f} ({s['difference']:+.4f}, {s['confidence']:.0%} CI "
                                f"{s['low']:+.4f} to {s['high']:+.4f}) beyond bless.max_slice_regression "
                                f"{rules.max_slice_regression}")
    return failures


def assess_quality(predictions: HoldoutPredictions, rules: BlessParams, champion_version: str | None = None,
                   comparable: bool = True, baselines: dict | None = None, training: dict | None = None) -> StageReport:
    """Pure core of the quality stage: figures, then the gate (baselines, champion, slices); `training`: how the
    train stage ran, for the advice when the candidate trails the baselines."""
    labels, n_classes = predictions.labels, len(predictions.classes)
    candidate = classification_metrics(labels, predictions.candidate, n_classes)
    per_class = {name: {"candidate": figures} for name, figures in
                 per_class_metrics(labels, predictions.candidate, predictions.classes).items()}
    champion, gain = None, None
    if predictions.champion is not None:
        champion = classification_metrics(labels, predictions.champion, n_classes)
        gain = paired_bootstrap(labels, predictions.candidate, predictions.champion, n_classes, rules.metric,
                                rules.bootstrap, rules.confidence)
        for name, figures in per_class_metrics(labels, predictions.champion, predictions.classes).items():
            per_class[name]["champion"] = figures
    elif champion_version is not None:
        champion = {}   # a champion exists but cannot be compared: judge_candidate says so
    slices = score_slices(predictions, rules)
    gap = baseline_gap(predictions, rules) if baselines else None
    verdict = judge_candidate(candidate, champion, comparable, rules, champion_version, baselines, gain, training,
                              gap)
    judged, slice_failures = verdict.gate, judge_slices(slices, rules)
    failures = (judged.reasons if judged.status == "fail" else []) + slice_failures
    gate = GateResult.decide("quality", failures, judged.reasons if judged.status == "warn" else [],
                             passed="; ".join(judged.reasons))
    outcome = BlessOutcome.SLICE_REGRESSION if slice_failures and judged.status != "fail" else verdict.outcome
    headline = f"{rules.metric} {candidate[rules.metric]:.4f}"
    if gain:
        headline += (f" vs champion v{champion_version} {champion[rules.metric]:.4f}: {gain['difference']:+.4f} "
                     f"({gain['confidence']:.0%} CI {gain['low']:+.4f} to {gain['high']:+.4f})")
    details = {"metric": rules.metric, "holdout_rows": int(len(labels)), "candidate": candidate, "champion": champion,
               "champion_version": champion_version, "comparable": comparable, "gain": gain, "per_class": per_class,
               "slices": slices, "baselines": baselines or {}, "baseline_gap": gap}
    return StageReport(stage="quality", gate=gate, headline=headline, details=details, outcome=outcome)
