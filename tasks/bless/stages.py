"""Run bless's stages in order, stop at the first failure, and combine their gates into the one bless gate and
its outcome."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tasks.core.gate import GateResult
from tasks.core.verdicts import BlessOutcome, StageReport

log = logging.getLogger("torchship.bless")


def run_stages(stages: list[Callable[[], StageReport]]) -> list[StageReport]:
    """Each stage in turn, timed; none after the first that fails (a later stage would judge a model already
    refused, and costs seconds: the service stage starts a process)."""
    reports = []
    for stage in stages:
        started = time.perf_counter()
        report = stage()
        reports.append(report.model_copy(update={"seconds": round(time.perf_counter() - started, 3)}))
        log.info("bless %s: %s (%.1fs)", report.stage, report.gate.summary(), reports[-1].seconds)
        if report.gate.status == "fail":
            break
    return reports


def combine(reports: list[StageReport]) -> GateResult:
    """fail if a stage failed, else warn if one warned, else pass; reasons name their stage. A failure or warning
    carries its stage's own reasons (and the other stages' warnings); a pass, every stage's one-line verdict."""
    failures = [f"{r.stage}: {reason}" for r in reports if r.gate.status == "fail" for reason in r.gate.reasons]
    warnings = [f"{r.stage}: {reason}" for r in reports if r.gate.status == "warn" for reason in r.gate.reasons]
    passed = [f"{r.stage}: {reason}" for r in reports for reason in r.gate.reasons]
    if failures or warnings:
        return GateResult.decide("bless", failures, warnings)
    return GateResult(gate="bless", status="pass", reasons=passed or ["no stage ran"])


STAGE_FAILED = {"performance": BlessOutcome.PERFORMANCE_FAILED, "service": BlessOutcome.SERVICE_FAILED}


def combine_outcomes(reports: list[StageReport]) -> BlessOutcome:
    """The first failed stage's outcome (quality's own decision, or that a later stage failed); with no failure,
    quality's decision (it runs first, always)."""
    failed = next((r for r in reports if r.gate.status == "fail"), None)
    if failed is not None and failed.stage in STAGE_FAILED:
        return STAGE_FAILED[failed.stage]
    return reports[0].outcome
