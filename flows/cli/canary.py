"""`torchship canary`: the progressive canary of the challenger, on a service started for it (replayed holdout
rows) or on a running one (its live traffic)."""
from __future__ import annotations

import os

import typer
from rich.table import Table

from flows.cli.output import console, quiet_expected_tracebacks
from flows.environment import enter_project
from tasks.core.env import TOKEN_ENV


def canary(url: str = typer.Option(None, "--url", help="A running service (e.g. http://127.0.0.1:8000): set its "
                                                       "split through /admin and observe its live traffic. "
                                                       "Default: start one and replay holdout rows."),
           token: str = typer.Option(None, "--token", envvar=TOKEN_ENV, show_envvar=True,
                                     help="The admin token the service at --url was started with."),
           request_log: str = typer.Option(None, "--request-log", help="The request log of the service at --url "
                                                                       "(default: serve.request_log).")) -> None:
    """Canary the `challenger` against the `champion`: a shadow phase, then canary.steps of traffic, each judged
    once it has canary.min_samples requests (error rate, p95 latency; PSI of the predictions and accuracy on
    feedback by paired tests at canary.confidence, filling the step further while a worrying figure is not yet
    significant). The last step passed promotes the challenger (the old champion is tagged previous); a failed step
    sends the traffic back to the champion, removes `challenger` and tags the version rejected. Each step is a tag
    on the version and an artifact in the flow run. Exits 0 whatever the verdict; errors exit non-zero."""
    enter_project()
    from flows.canary import canary_flow

    if token:
        os.environ[TOKEN_ENV] = token
    quiet_expected_tracebacks()
    where = f"the service at {url} (live traffic)" if url else "a service started for it (replayed holdout rows)"
    with console.status(f"canary on {where}: shadow, then canary.steps; each step waits for canary.min_samples"):
        report = canary_flow(params_file="params.yaml", url=url, request_log=request_log)
    render(report)


def render(report) -> None:
    if report.steps:
        table = Table(title="canary steps")
        for column in ("step", "status", "challenger", "requests", "errors", "p95 ms (chall. / champ.)", "PSI",
                       "accuracy (chall. / champ.)", "labelled pairs (needed)"):
            table.add_column(column, overflow="fold")
        for step in report.steps:
            ours, theirs = step.challenger, step.champion
            p95 = " / ".join(f"{f.p95_ms:.1f}" if f.p95_ms is not None else "-" for f in (ours, theirs))
            accuracy = " / ".join(f"{f.accuracy:.3f}" if f.accuracy is not None else "-" for f in (ours, theirs))
            colour = {"pass": "green", "fail": "red", "short": "yellow"}[step.status]
            needed = step.statistics.pairs_needed if step.statistics else None
            pairs = f"{step.pairs.labelled} ({needed})" if step.pairs and needed else "-"
            table.add_row(step.phase, f"[{colour}]{step.status}[/]", f"v{ours.version}", str(ours.requests),
                          str(ours.errors), p95, f"{step.psi:.3f}" if step.psi is not None else "-", accuracy, pairs)
        console.print(table)
    last = report.steps[-1].reasons if report.steps else report.gate.reasons
    console.print(f"[bold]canary gate[/] {report.gate.status}: {'; '.join(last)}")
    console.print(f"[bold]decision[/] {report.action} ({report.seconds:.1f} s)")
    console.print("aliases now: " + (", ".join(f"{a} → v{v}" for a, v in report.aliases.items()) or "none"))
