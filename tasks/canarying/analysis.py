"""The progressive canary's pure core: what one step saw of each variant, and the step's verdict.
No I/O: figures in, verdict out (tasks/canarying/observe.py builds the figures from a service)."""
from __future__ import annotations

import math

from tasks.config import CanaryParams
from tasks.core.gate import GateResult
from tasks.core.verdicts import StepStatus, StepVerdict, VariantFigures

PSI_FLOOR = 1e-4   # a class one side never predicted: its share is floored so PSI stays finite (and large)


def phase_name(share: float, shadow: bool) -> str:
    return "shadow" if shadow else f"{share:.0%}"


def psi(expected: dict[str, int], actual: dict[str, int]) -> float | None:
    """Population stability index of two categorical distributions (counts by class); None if either is empty."""
    total_e, total_a = sum(expected.values()), sum(actual.values())
    if not total_e or not total_a:
        return None
    value = 0.0
    for name in set(expected) | set(actual):
        e = max(expected.get(name, 0) / total_e, PSI_FLOOR)
        a = max(actual.get(name, 0) / total_a, PSI_FLOOR)
        value += (a - e) * math.log(a / e)
    return value


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


def judge_step(phase: str, share: float, champion: VariantFigures, challenger: VariantFigures,
               rules: CanaryParams, champion_p95_ms: float | None = None, seconds: float = 0.0) -> StepVerdict:
    """Pass, fail or short. `champion_p95_ms`: the champion's p95 from an earlier step, used when it answered
    too few requests in this one (at 100% it answers none)."""
    def verdict(status: StepStatus, reasons: list[str], value: float | None = None) -> StepVerdict:
        return StepVerdict(phase=phase, share=share, status=status, reasons=reasons, champion=champion,
                           challenger=challenger, psi=value, seconds=seconds)

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
                        f"{reference:.1f} ms (and more than {rules.p95_slack_ms:g} ms over it)")
    shift = psi(champion.labels, challenger.labels)
    if shift is not None and shift > rules.max_psi:
        failures.append(f"PSI of the predicted classes {shift:.3f} > canary.max_psi {rules.max_psi:g} "
                        f"(champion {champion.labels}, challenger {challenger.labels})")
    ours, theirs = challenger.accuracy, champion.accuracy
    if ours is not None and theirs is not None and ours < theirs - rules.max_metric_drop:
        failures.append(f"accuracy on {challenger.labelled} labelled rows {ours:.3f} < champion's {theirs:.3f} "
                        f"- canary.max_metric_drop {rules.max_metric_drop:g}")
    if failures:
        return verdict("fail", failures, shift)
    accuracy = f", accuracy {ours:.3f} vs {theirs:.3f}" if ours is not None and theirs is not None else ""
    p95 = f", p95 {challenger.p95_ms:.1f} vs {reference:.1f} ms" if challenger.p95_ms is not None and reference else ""
    return verdict("pass", [f"{phase}: {challenger.requests} requests, {challenger.errors} errors{p95}"
                            + (f", PSI {shift:.3f}" if shift is not None else "") + accuracy], shift)


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
