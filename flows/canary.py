"""The canary as a flow of its own (`torchship canary`, the `canary` deployment) and the pipeline's canary step's
records: every step's decision and the final one as markdown artifacts in the flow run, a rollback as the Prefect
event `torchship.canary.rolled-back` (as the monitor emits its drift event: only where a server hears it)."""
from __future__ import annotations

import os
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.environment import server_configured
from tasks import canary
from tasks.canary.client import ServiceClient
from tasks.config import load_params
from tasks.core.env import TOKEN_ENV
from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params
from tasks.core.verdicts import CanaryOutcome, CanaryReport, StepVerdict, VariantFigures
from tasks.stages.rebuild import pull_champion_splits
from tasks.workspace.lock import workspace_lock

ROLLBACK_EVENT = "torchship.canary.rolled-back"


def figures_row(role: str, f: VariantFigures) -> str:
    accuracy = f"{f.accuracy:.3f} ({f.labelled} labelled)" if f.accuracy is not None else "no feedback"
    p95 = f"{f.p95_ms:.1f}" if f.p95_ms is not None else "-"
    return f"| {role} v{f.version} | {f.requests} | {f.errors} | {p95} | {accuracy} | {f.labels} |"


def statistics_markdown(verdict: StepVerdict) -> str:
    """How the quality checks were judged: on which paired rows, at which level, and the pairs a drop needs."""
    pairs, stats = verdict.pairs, verdict.statistics
    if pairs is None or stats is None:
        return ""
    figures = [f"{pairs.rows} rows scored by both variants ({pairs.labelled} labelled: {pairs.champion_only} only "
               f"the champion got right, {pairs.challenger_only} only the challenger); look {stats.look}, each "
               f"check at level {stats.alpha:.4f}"]
    if stats.drop is not None:
        figures.append(f"accuracy drop {stats.drop:+.3f}, exact paired p {stats.drop_p:.4f}; a drop of "
                       f"canary.max_metric_drop needs {stats.pairs_needed} labelled pairs")
    if stats.psi_p is not None:
        figures.append(f"PSI permutation p {stats.psi_p:.4f}")
    return "Statistics: " + "; ".join(figures) + ".\n\n"


def step_markdown(verdict: StepVerdict) -> str:
    psi = f"{verdict.psi:.3f}" if verdict.psi is not None else "-"
    return (f"# Canary step {verdict.phase}: {verdict.status}\n\n{'; '.join(verdict.reasons)}\n\n"
            f"Share {verdict.share:.0%}, {verdict.seconds:.1f} s, PSI {psi}.\n\n" + statistics_markdown(verdict) +
            "| variant | requests | errors | p95 ms | accuracy | predicted classes |\n|---|---|---|---|---|---|\n"
            f"{figures_row('champion', verdict.champion)}\n{figures_row('challenger', verdict.challenger)}\n")


def decision_markdown(report: CanaryReport) -> str:
    steps = "\n".join(f"| {s.phase} | {s.status} | {s.challenger.requests} | {'; '.join(s.reasons)} |"
                      for s in report.steps)
    return (f"# Canary: {report.action}\n\nGate {report.gate.status}.\n\n"
            + ("| step | status | challenger requests | why |\n|---|---|---|---|\n" + steps + "\n\n" if steps else
               "; ".join(report.gate.reasons) + "\n\n")
            + f"Aliases now: {report.aliases}\n")


def record_step(verdict: StepVerdict) -> None:
    key = "canary-step-" + verdict.phase.replace("%", "pct")
    create_markdown_artifact(key=key, markdown=step_markdown(verdict), description=f"canary step {verdict.phase}")


def record_decision(report: CanaryReport, model_name: str) -> None:
    """The final decision as an artifact; a rollback also as an event (with a server to hear it)."""
    create_markdown_artifact(key="canary-decision", markdown=decision_markdown(report), description="canary decision")
    if report.outcome is CanaryOutcome.ROLLED_BACK and server_configured():
        from prefect.events import emit_event

        last = report.steps[-1]
        emit_event(event=ROLLBACK_EVENT, resource={"prefect.resource.id": f"torchship.model.{model_name}",
                                                   "prefect.resource.name": model_name},
                   payload={"version": last.challenger.version, "step": last.phase, "reasons": last.reasons,
                            "outcome": report.outcome.value, "action": report.action})


def live_link(url: str, request_log: str | None, default_log: str) -> ServiceClient:
    """The running service at `url`; its admin token from TORCHSHIP_ADMIN_TOKEN (never a flow parameter: those are
    stored in Prefect's database)."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(f"a canary on the service at {url} sets its split through /admin: set {TOKEN_ENV} to the "
                          "token the service was started with")
    log = request_log or default_log
    if not log:
        raise ConfigError("the canary reads the service's request log (serve.request_log in params.yaml is empty): "
                          "pass --request-log with the path the service writes to")
    return ServiceClient(url.rstrip("/"), token, Path(log))


@task(name="pull-prepared-data", retries=2, retry_delay_seconds=10)   # I/O on the registry and the DVC remote
def pull_prepared(params: Params) -> None:
    """On a fresh clone (a worker's, a serving host's): the champion's splits and schema, which the monitor, the
    batch gate and the canary's replay read. Nothing to do where they are already present."""
    if (outcome := pull_champion_splits(params)) is not None:
        get_run_logger().info(outcome)


@flow(name="torchship-canary", log_prints=True)
def canary_flow(params_file: str = "params.yaml", url: str | None = None, request_log: str | None = None
                ) -> CanaryReport:
    """Canary the current challenger against the champion: on the service at `url` (its live traffic), or, by
    default, on a service started for the occasion with replayed holdout rows. Smoke-tests the champion alone
    on that service when there is no challenger (embedded only)."""
    params = load_params(params_file)
    service = live_link(url, request_log, params.serve.request_log) if url else None
    pull_prepared(params)   # a serving host's clone has no data/prepare/ (the schema, the replayed holdout)
    with workspace_lock("the canary", params.retrain.workspace_wait_s):
        report = task(name="canary")(canary.run)(params, None, service, record_step)
    record_decision(report, params.data.registered_model_name())
    return report
