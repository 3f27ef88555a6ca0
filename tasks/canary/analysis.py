"""The progressive canary's pure core: what one step saw of each variant, and the step's verdict.
No I/O: figures in, verdict out (tasks/canary/observe.py builds the figures from a service)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tasks.core.gate import GateResult
from tasks.core.machine import describe_load
from tasks.core.paired import paired_accuracy_drop, paired_psi_p_value, pairs_needed, psi_of_counts
from tasks.core.params_spec import CanaryParams
from tasks.core.verdicts import PairedRows, StepStatistics, StepStatus, StepVerdict, VariantFigures


class Check(NamedTuple):
    """One quality check of a step: pass, fail or short (a worrying figure the step has too few rows to judge)."""

    status: StepStatus
    reason: str


def phase_name(share: float, shadow: bool) -> str:
    return "shadow" if shadow else f"{share:.0%}"


def psi(expected: dict[str, int], actual: dict[str, int]) -> float | None:
    """Population stability index of two categorical distributions (counts by class); None if either is empty."""
    if not sum(expected.values()) or not sum(actual.values()):
        return None
    names = sorted(set(expected) | set(actual))
    return float(psi_of_counts(np.array([expected.get(n, 0) for n in names], dtype=np.float64),
                               np.array([actual.get(n, 0) for n in names], dtype=np.float64)))


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile from cumulative (upper bound, count) buckets, interpolated within the bucket it falls in, as
    Prometheus's histogram_quantile does; None without observations. The +Inf bucket answers its lower bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


QUALITY_CHECKS = 2   # PSI and accuracy: each may roll a step back


def step_alpha(rules: CanaryParams, look: int = 1) -> float:
    """The level each quality check is tested at in a phase's `look`-th judgement: canary.confidence holds for the
    whole canary, so 1 - confidence is shared among its phases and the two checks, and within a phase among its
    looks, half at each (1/2, 1/4, ...: a step judged again on more rows spends less). Bonferroni: a challenger as
    good as the champion is rolled back by chance in at most 1 - confidence of canaries."""
    phases = len(rules.steps) + int(rules.shadow)
    return (1.0 - rules.confidence) / (phases * QUALITY_CHECKS * 2 ** look)


def class_table(pairs: PairedRows) -> np.ndarray:
    """pairs.classes as a (K, K) array: champion's class (rows) by challenger's class (columns)."""
    names = sorted(set(pairs.classes) | {c for row in pairs.classes.values() for c in row})
    return np.array([[pairs.classes.get(a, {}).get(b, 0) for b in names] for a in names], dtype=np.int64)


def judge_shift(champion: VariantFigures, challenger: VariantFigures, pairs: PairedRows | None,
                rules: CanaryParams, stats: StepStatistics) -> tuple[Check | None, float | None]:
    """PSI of the predicted classes: fails only above canary.max_psi AND significant by a paired permutation test
    (each row's two answers swapped at random); above it but not significant asks for more rows."""
    shift = psi(champion.labels, challenger.labels)
    if shift is None:
        return None, None
    if shift <= rules.max_psi:
        return Check("pass", f"PSI {shift:.3f}"), shift
    if pairs is None or not pairs.rows:
        return Check("short", f"PSI of the predicted classes {shift:.3f} > canary.max_psi {rules.max_psi:g} on rows "
                              "the two variants did not both score: no paired test, not judged"), shift
    stats.psi_p = paired_psi_p_value(class_table(pairs), shift)
    figure = (f"PSI of the predicted classes {shift:.3f} > canary.max_psi {rules.max_psi:g} on {pairs.rows} paired "
              f"rows (permutation p {stats.psi_p:.4f}, level {stats.alpha:.4f}; champion {champion.labels}, "
              f"challenger {challenger.labels})")
    if stats.psi_p < stats.alpha:
        return Check("fail", figure), shift
    return Check("short", figure + ": not significant, more rows needed"), shift


def judge_accuracy(champion: VariantFigures, challenger: VariantFigures, pairs: PairedRows | None,
                   rules: CanaryParams, stats: StepStatistics) -> Check | None:
    """Accuracy on the labelled rows both scored (McNemar's exact test): fails only when the drop is larger than
    canary.max_metric_drop AND significant; a larger drop that is not significant on fewer labelled pairs than
    such a drop needs (at the observed discordance) asks for more rows; otherwise it passes."""
    if pairs is None or not pairs.labelled:
        return None   # no labels yet (live traffic): accuracy is not compared
    test = paired_accuracy_drop(pairs.labelled, pairs.champion_only, pairs.challenger_only)
    discordant = (pairs.champion_only + pairs.challenger_only + 1) / (pairs.labelled + 2)   # never 0 on few rows
    stats.drop, stats.drop_p = test.drop, test.p_value
    stats.pairs_needed = pairs_needed(rules.max_metric_drop, discordant, stats.alpha / 2)   # at the next look's level
    ours, theirs = (f"{f.accuracy:.3f}" if f.accuracy is not None else "-" for f in (challenger, champion))
    figure = (f"accuracy {ours} vs champion's {theirs} on {test.rows} labelled "
              f"pairs: drop {test.drop:+.3f} (exact paired p {test.p_value:.4f}, level {stats.alpha:.4f}; a drop of "
              f"canary.max_metric_drop {rules.max_metric_drop:g} needs {stats.pairs_needed} pairs at discordance "
              f"{discordant:.3f})")
    if test.drop <= rules.max_metric_drop:
        return Check("pass", figure)
    if test.p_value < stats.alpha:
        return Check("fail", figure + ": significant")
    if test.rows < stats.pairs_needed:
        return Check("short", figure + ": not significant, more labelled pairs needed")
    return Check("pass", figure + ": not significant")


def judge_step(phase: str, share: float, champion: VariantFigures, challenger: VariantFigures,
               rules: CanaryParams, champion_p95_ms: float | None = None, seconds: float = 0.0,
               pairs: PairedRows | None = None, look: int = 1, load: dict | None = None) -> StepVerdict:
    """Pass, fail or short. `champion_p95_ms`: the champion's p95 from an earlier step, used when it answered
    too few requests in this one (at 100% it answers none). `pairs`: the rows both variants scored, which the
    quality checks (PSI, accuracy) are judged on; `look`: the how-manieth judgement of this step. A step is short
    with too few requests, or when a quality check saw a worrying figure it could not yet call significant: the
    canary fills it further, within canary.step_max_s, and judges it again. `load`: the machine's while the step
    filled, named beside a latency failure (which the canary measures again before it stands: latency_only)."""
    stats = StepStatistics(alpha=step_alpha(rules, look), look=look, load=load or {})

    def verdict(status: StepStatus, reasons: list[str], value: float | None = None) -> StepVerdict:
        return StepVerdict(phase=phase, share=share, status=status, reasons=reasons, champion=champion,
                           challenger=challenger, psi=value, seconds=seconds, pairs=pairs, statistics=stats)

    if challenger.requests < rules.min_samples:
        return verdict("short", [f"{phase}: the challenger {'scored' if phase == 'shadow' else 'answered'} "
                                 f"{challenger.requests} of the {rules.min_samples} requests canary.min_samples "
                                 f"asks for within canary.step_max_s = {rules.step_max_s:g} s: too little traffic "
                                 "to judge"])
    failures = []
    if challenger.error_rate > rules.max_error_rate:
        failures.append(f"error rate {challenger.error_rate:.1%} ({challenger.errors} of {challenger.requests}) > "
                        f"canary.max_error_rate {rules.max_error_rate:.1%}")
    reference = champion.p95_ms if champion.requests >= rules.min_samples else champion_p95_ms
    if challenger.p95_ms is not None and reference is not None and \
            challenger.p95_ms > rules.max_p95_ratio * reference and challenger.p95_ms - reference > rules.p95_slack_ms:
        failures.append(f"p95 latency {challenger.p95_ms:.1f} ms > {rules.max_p95_ratio:g}x the champion's "
                        f"{reference:.1f} ms (and more than {rules.p95_slack_ms:g} ms over it; "
                        f"{describe_load(stats.load)})")
        stats.latency_only = len(failures) == 1
    shift_check, shift = judge_shift(champion, challenger, pairs, rules, stats)
    checks = [c for c in (shift_check, judge_accuracy(champion, challenger, pairs, rules, stats)) if c is not None]
    failures += [c.reason for c in checks if c.status == "fail"]
    stats.latency_only = stats.latency_only and len(failures) == 1
    if failures:
        return verdict("fail", failures, shift)
    waiting = [c.reason for c in checks if c.status == "short"]
    if waiting:
        return verdict("short", [f"{phase}: " + "; ".join(waiting)], shift)
    p95 = f", p95 {challenger.p95_ms:.1f} vs {reference:.1f} ms" if challenger.p95_ms is not None and reference else ""
    return verdict("pass", [f"{phase}: {challenger.requests} requests, {challenger.errors} errors{p95}"
                            + "".join(f", {c.reason}" for c in checks)], shift)


def requests_wanted(verdict: StepVerdict, requests: int, rules: CanaryParams) -> int:
    """After a short verdict on a quality check: the challenger requests to fill the step to before judging it
    again: enough, at the step's rate of labelled pairs per request, for the pairs the drop needs; at least
    min_samples more."""
    pairs, stats = verdict.pairs, verdict.statistics
    more = rules.min_samples
    if pairs is not None and pairs.labelled and stats is not None and stats.pairs_needed:
        more = max(more, math.ceil((stats.pairs_needed - pairs.labelled) * requests / pairs.labelled))
    return requests + more


def judge_smoke(champion: VariantFigures, rules: CanaryParams) -> GateResult:
    """No challenger: the champion alone on the replayed rows fails on the error rate a challenger's step may not
    exceed (canary.max_error_rate); its p95 and accuracy are reported, with nothing to compare them with."""
    if not champion.requests:
        return GateResult.decide("canary", ["no request was replayed (the holdout is empty)"])
    if champion.error_rate > rules.max_error_rate:
        return GateResult.decide("canary", [
            f"champion v{champion.version} failed {champion.errors} of {champion.requests} replayed requests "
            f"({champion.error_rate:.1%} > canary.max_error_rate {rules.max_error_rate:.1%})"])
    p95 = f", p95 {champion.p95_ms:.1f} ms" if champion.p95_ms is not None else ""
    accuracy = f", accuracy {champion.accuracy:.3f} on {champion.labelled} labelled" \
        if champion.accuracy is not None else ""
    return GateResult.decide("canary", [], passed=f"champion v{champion.version} answered {champion.requests} "
                                                  f"requests, {champion.errors} errors{p95}{accuracy}")
