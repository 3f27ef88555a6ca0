"""The progressive canary on a running service: a shadow phase, then the challenger's share raised step by step
(canary.steps); each step filled to canary.min_samples (by replayed traffic, or by waiting for live traffic) and
judged (tasks/canary/analysis.py), filled further while a quality check is short of the rows it needs; then
the registry acted on under the alias lock: promote at the end, reject at the first failed step, or leave it at
an inconclusive step. The traffic goes back to the champion on every way out. With no challenger, one smoke
step: the champion alone answers the replayed rows."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tasks.canary.analysis import judge_step, phase_name, requests_wanted
from tasks.canary.client import ServiceClient
from tasks.canary.observe import Scrape, StepLogs, challenger_samples, read_step_logs, smoke_figures, step_figures
from tasks.core.gate import GateResult
from tasks.core.machine import load_during
from tasks.core.params_spec import CanaryParams
from tasks.core.verdicts import CanaryOutcome, StepVerdict, VariantFigures
from tasks.registry.history import run_actor
from tasks.registry.read import CHALLENGER, CHAMPION, alias_version
from tasks.registry.write import promote, recorded_move, reject

log = logging.getLogger("torchship.canary")
REPLAY_CHUNK = 25        # replayed requests between two looks at /metrics
LOG_WAIT_S = 5.0         # how long a step's end waits for the service to write the step's lines (it buffers them)
INCONCLUSIVE_TAG = "canary_inconclusive"
Record = Callable[[StepVerdict], None]


class Traffic(Protocol):
    rows: int   # distinct rows it cycles through

    def send(self, count: int) -> int: ...


@dataclass
class OpenStep:
    """A step under way: the metrics before it, when it started (wall clock for the logs, monotonic for the
    budget), and the requests replayed into it so far."""

    share: float
    shadow_phase: bool
    before: Scrape
    since: float
    started: float
    sent: int = 0


def open_step(service: ServiceClient, share: float, shadow_phase: bool) -> OpenStep:
    service.split(share, shadow=True)   # the variant not answering shadows every step: paired rows for PSI, accuracy
    return OpenStep(share, shadow_phase, service.scrape(), time.time(), time.monotonic())


def fill_step(service: ServiceClient, step: OpenStep, wanted: int, challenger: str, rules: CanaryParams,
              traffic: Traffic | None, budget: int) -> tuple[Scrape, bool]:
    """Wait (or replay) until the challenger has `wanted` requests in the step, step_max_s passed, or `budget`
    requests were replayed into it. Returns (metrics delta since the step opened, whether the step can be filled
    no further)."""
    while True:
        if traffic is not None:
            step.sent += traffic.send(REPLAY_CHUNK)
        else:
            time.sleep(rules.poll_s)
        delta = service.scrape().minus(step.before)
        samples = challenger_samples(delta, challenger, step.shadow_phase)
        spent = time.monotonic() - step.started > rules.step_max_s or \
            (traffic is not None and step.sent >= budget)
        if samples >= wanted or spent:
            return delta, spent
        log.info("canary %s: %d of %d challenger requests", phase_name(step.share, step.shadow_phase), samples,
                 wanted)


def step_logs(service: ServiceClient, since: float, expected_rows: int, variant: str = CHALLENGER,
              expected_labels: int = 0) -> StepLogs:
    """The step's lines once the service has written them (at least `expected_rows` by `variant`, and
    `expected_labels` feedback labels), or what is there after LOG_WAIT_S."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        logs = read_step_logs(service.request_log, since)
        written = sum(line["variant"] == variant for line in logs.served + logs.shadow)
        if written >= expected_rows and len(logs.feedback) >= expected_labels or time.monotonic() > deadline:
            return logs
        time.sleep(0.2)


def judge_phase(service: ServiceClient, step: OpenStep, champion: str, challenger: str, rules: CanaryParams,
                traffic: Traffic | None, champion_p95: float | None) -> StepVerdict:
    """Fill the step and judge it (judge_filled). A step whose one failure is latency is measured again on fresh
    requests (the step opened anew at the same share) and fails only when that measurement fails too: one stall of
    a shared machine moves a p95 for whichever variant it hits, while a truly slower challenger fails both times."""
    verdict = judge_filled(service, step, champion, challenger, rules, traffic, champion_p95)
    if verdict.status != "fail" or verdict.statistics is None or not verdict.statistics.latency_only:
        return verdict
    first = "; ".join(verdict.reasons)
    log.info("canary %s: latency failed, measuring again on fresh requests: %s", verdict.phase, first)
    again = judge_filled(service, open_step(service, step.share, step.shadow_phase), champion, challenger, rules,
                         traffic, champion_p95)
    if again.status == "fail":
        return again.model_copy(update={"reasons": again.reasons + [f"the first measurement failed too: {first}"]})
    return again.model_copy(update={"reasons": [again.reasons[0] + f" (passed when measured again; the first "
                                                                    f"measurement failed: {first})",
                                                *again.reasons[1:]]})


def judge_filled(service: ServiceClient, step: OpenStep, champion: str, challenger: str, rules: CanaryParams,
                 traffic: Traffic | None, champion_p95: float | None) -> StepVerdict:
    """Fill the step to min_samples and judge it, with the machine's load meanwhile; while it is short on a quality
    check (a worrying figure, not yet significant) and can be filled further, fill it to the requests that check
    wants and judge it again."""
    wanted, look = rules.min_samples, 1
    while True:
        # the first fill may reuse rows (error rate and latency count requests); a refill is for quality, which
        # counts each distinct row once: no more than one pass over the replay's rows
        budget = rules.replay_max_requests if look == 1 or traffic is None else \
            min(rules.replay_max_requests, traffic.rows)
        with load_during() as load:
            delta, spent = fill_step(service, step, wanted, challenger, rules, traffic, budget)
        requests = challenger_samples(delta, challenger, step.shadow_phase)
        ok_rows = requests - delta.count(CHALLENGER, challenger, "shadow-error" if step.shadow_phase else "error")
        first, second, pairs = step_figures(delta, step_logs(service, step.since, ok_rows), champion, challenger,
                                            step.shadow_phase)
        verdict = judge_step(phase_name(step.share, step.shadow_phase), step.share, first, second, rules,
                             champion_p95, time.monotonic() - step.started, pairs, look, load)
        replayed_all = traffic is not None and step.sent >= traffic.rows   # more replay adds no distinct row
        if verdict.status != "short" or spent or replayed_all or requests < rules.min_samples:
            return verdict
        wanted, look = requests_wanted(verdict, requests, rules), look + 1
        log.info("canary %s: short, filling to %d challenger requests: %s", verdict.phase, wanted,
                 "; ".join(verdict.reasons))


def run_steps(service: ServiceClient, champion: str, challenger: str, rules: CanaryParams,
              traffic: Traffic | None = None, record: Record | None = None) -> list[StepVerdict]:
    """Every phase in turn until one does not pass; traffic back to the champion afterwards, whatever happened."""
    phases = ([(0.0, True)] if rules.shadow else []) + [(share, False) for share in rules.steps]
    verdicts: list[StepVerdict] = []
    champion_p95 = None
    try:
        for share, shadow_phase in phases:
            verdict = judge_phase(service, open_step(service, share, shadow_phase), champion, challenger, rules,
                                  traffic, champion_p95)
            if verdict.champion.requests >= rules.min_samples and verdict.champion.p95_ms is not None:
                champion_p95 = verdict.champion.p95_ms
            log.info("canary %s: %s: %s", verdict.phase, verdict.status, "; ".join(verdict.reasons))
            verdicts.append(verdict)
            if record is not None:
                record(verdict)
            if verdict.status != "pass":
                break
    finally:
        service.split(0.0, shadow=False)
    return verdicts


def smoke_step(service: ServiceClient, champion: str, traffic: Traffic, requests: int) -> VariantFigures:
    """The champion alone (share 0, no shadow: there is no other variant) answers `requests` replayed rows; its
    figures from the service's metrics and logs, as a step's are."""
    service.split(0.0, shadow=False)
    before, since = service.scrape(), time.time()
    sent = traffic.send(requests)
    delta = service.scrape().minus(before)
    answered = delta.count(CHAMPION, champion, "ok")
    logs = step_logs(service, since, answered, CHAMPION, expected_labels=answered)   # the replay labels every answer
    return smoke_figures(delta, logs, champion, sent)


def promote_or_roll_back(client, name: str, challenger: str, verdicts: list[StepVerdict], rules: CanaryParams
                         ) -> tuple[GateResult, CanaryOutcome, str]:
    """Act on the registry under the alias lock (re-checking that `challenger` still names the version): promote
    after the last step passed, reject at a failed one, record an inconclusive one. Returns (gate, outcome, the
    action in words)."""
    last = verdicts[-1]
    reasons = [f"{v.phase} {v.status}: {'; '.join(v.reasons)}" for v in verdicts]
    if last.status == "short":
        gate = GateResult(gate="canary", status="warn", reasons=reasons)
    else:
        gate = GateResult(gate="canary", status=last.status, reasons=reasons)
    proof = f"v{challenger} tags canary.* (one per step); canary report: " + "; ".join(reasons)
    with recorded_move(client, name, run_actor("canary"), evidence=proof) as move:
        still = alias_version(client, name, CHALLENGER)
        if still is None or str(still.version) != challenger:
            return gate, CanaryOutcome.SUPERSEDED, (
                f"nothing moved: `challenger` left v{challenger} during the canary (now "
                f"{'v' + str(still.version) if still else 'none'}); its verdict is recorded only here")
        if last.status == "fail":
            move.reason = f"canary rolled back at step {last.phase}: " + "; ".join(last.reasons)
            reject(client, name, challenger, f"canary step {last.phase}: " + "; ".join(last.reasons))
            return gate, CanaryOutcome.ROLLED_BACK, (f"rolled back at step {last.phase}: v{challenger} rejected, "
                                                     "champion unchanged")
        if last.status == "short":
            client.set_model_version_tag(name, challenger, INCONCLUSIVE_TAG, "; ".join(last.reasons))
            return gate, CanaryOutcome.INCONCLUSIVE, (
                f"inconclusive at step {last.phase}: traffic back to the champion; v{challenger} stays "
                "challenger (its reasons say how many rows a verdict needs: run `torchship canary` again with more "
                "traffic, or a longer canary.step_max_s)")
        move.reason = f"canary: {len(verdicts)} steps passed up to 100%"
        old = promote(client, name, challenger, move.reason)
        return gate, CanaryOutcome.PROMOTED, f"promoted v{challenger} to champion (v{old} tagged previous)"


def tag_step(client, name: str, version: str, verdict: StepVerdict) -> None:
    """Each step's decision as a tag on the version: canary.<phase> = status: reasons."""
    key = "canary." + verdict.phase.replace("%", "pct")
    client.set_model_version_tag(name, version, key, f"{verdict.status}: {'; '.join(verdict.reasons)}"[:5000])
