"""`torchship monitor`, `torchship deploy` and `torchship demo drift`: the closed loop from the command line."""
from __future__ import annotations

import os
import subprocess
import sys

import typer
from rich.table import Table

from flows.cli.output import console, fail, quiet_expected_tracebacks
from flows.environment import enter_project
from tasks.core.env import PREFECT_API_URL
from tasks.ops.stack_parts import POOL  # prefect.yaml's process pool: the one the team stack's workers serve

demo_app = typer.Typer(help="Demonstrations on the synthetic data.", no_args_is_help=True)


def monitor(report_only: bool = typer.Option(False, "--report-only",
                                             help="Judge and record, but never start a retrain.")) -> None:
    """Judge the newest window of served traffic for drift (Evidently) against the training split.

    On material drift, and unless a guard holds it back (cooldown, daily budget, too few new labels, loop
    protection, a busy workspace), start a retrain: with a Prefect server by the event torchship.drift.detected
    (the `retrain` deployment's trigger), in the embedded default by calling the retrain flow. Exits 0 either
    way; the decision and its reasons are printed, recorded, and shown by `torchship status`."""
    enter_project()
    from flows.loop import monitor as monitor_flow

    quiet_expected_tracebacks()
    decision = monitor_flow(params_file="params.yaml", act=not report_only)
    render_decision(decision)


def render_decision(decision) -> None:
    colour = {"fired": "yellow", "suppressed": "cyan", "no drift": "green", "retrained": "green"}[decision.outcome]
    console.print(f"[bold]{decision.gate.gate} gate[/] {decision.gate.summary()}")
    console.print(f"[bold]trigger[/] [{colour}]{decision.outcome}[/]: " + "; ".join(decision.reasons))
    if decision.run:
        console.print(f"  retrain: {decision.run}")
    if decision.report:
        console.print(f"  Evidently report: {decision.report}")


def decisions_table(decisions, where: object = "data/monitor/decisions.jsonl") -> Table:
    import datetime as dt

    table = Table(title=f"drift → retrain decisions (newest first; {where})")
    for column in ("time (UTC)", "outcome", "why", "window"):
        table.add_column(column, overflow="fold")
    for d in decisions:
        when = dt.datetime.fromtimestamp(d.ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        window = f"{d.window.get('rows', '?')} rows, {d.window.get('labelled', '?')} labelled" if d.window else ""
        table.add_row(when, d.outcome, "; ".join(d.reasons), window)
    return table


def deploy() -> None:
    """Register torchship's deployments (prefect.yaml) on the configured Prefect server.

    Needs PREFECT_API_URL (e.g. after `prefect server start`, export PREFECT_API_URL=http://127.0.0.1:4200/api).
    Creates the `torchship-process` work pool if missing, runs `prefect deploy --all`, and prints how to start
    a worker. The pipeline then runs on its cron schedule, the monitor on its interval, and a drift event
    starts the retrain deployment."""
    root = enter_project()
    api = os.environ.get(PREFECT_API_URL)
    if not api:
        fail("PREFECT_API_URL is not set: start a server (`prefect server start`) or point at yours, e.g.\n"
             "  export PREFECT_API_URL=http://127.0.0.1:4200/api\nthen run `torchship deploy` again. "
             "(The embedded default, `make pipeline`, needs no server and no deployments.)")
    prefect = [sys.executable, "-m", "prefect"]
    pools = subprocess.run([*prefect, "work-pool", "inspect", POOL], capture_output=True, text=True, cwd=root)
    if pools.returncode != 0:
        created = subprocess.run([*prefect, "work-pool", "create", POOL, "--type", "process"], capture_output=True,
                                 text=True, cwd=root)
        if created.returncode != 0:
            fail(f"could not create work pool {POOL} on {api}:\n{created.stdout[-2000:]}{created.stderr[-2000:]}")
        console.print(f"created work pool [bold]{POOL}[/] (process)")
    result = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], capture_output=True, text=True, cwd=root)
    if result.returncode != 0:
        fail(f"prefect deploy --all failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    ensure_crash_watch(prefect, root)
    console.print(f"deployed to {api}: pipeline (cron), monitor (interval), retrain (on torchship.drift.detected), "
                  "canary (on demand)")
    console.print(f"Start a worker in this folder:\n  [bold]prefect worker start --pool {POOL}[/]\n"
                  "Run one now: prefect deployment run 'torchship-pipeline/pipeline'")


def ensure_crash_watch(prefect: list[str], root) -> None:
    """The automation that marks the flow run of a machine that died Crashed (tasks/ops/crash_watch.py), created
    once per server."""
    import json

    from tasks.ops.crash_watch import AUTOMATION, automation_spec, crashed_within_s

    found = subprocess.run([*prefect, "automation", "inspect", AUTOMATION], capture_output=True, text=True, cwd=root)
    if found.returncode != 0:
        created = subprocess.run([*prefect, "automation", "create", "--from-json", json.dumps(automation_spec())],
                                 capture_output=True, text=True, cwd=root)
        if created.returncode != 0:
            fail(f"could not create the automation {AUTOMATION}:\n{created.stdout[-2000:]}{created.stderr[-2000:]}")
    console.print(f"automation [bold]{AUTOMATION}[/]: a flow run whose machine died is marked Crashed within "
                  f"{crashed_within_s():.0f} s")


@demo_app.command("drift")
def demo_drift(rows: int = typer.Option(2000, help="Rows of drifted traffic (normal traffic: a third of it)."),
               drift: float = typer.Option(0.5, min=0.0, max=1.0, help="The generator's drift knob (data.drift).")
               ) -> None:
    """Show the closed loop act on the synthetic data: serve, send normal then drifted traffic with feedback
    labels, and watch drift report -> trigger -> retrain -> bless -> canary -> promotion or rejection.

    Needs a champion (run `torchship run` first). Every step prints here; the runs show in `torchship ui`."""
    enter_project()
    from flows.loop import monitor as monitor_flow
    from tasks.config import load_params
    from tasks.ops.demo import DemoTraffic, running_demo_service

    params = load_params()
    if params.data.source != "synthetic":
        fail("the drift demo needs data.source=synthetic (its generator has the drift knob); on your own data, "
             "serve real traffic, post labels to /feedback and run `torchship monitor`.")
    from tasks.core.registry import CHAMPION, alias_version, registry_client

    if alias_version(registry_client(params.tracking), params.data.registered_model_name(), CHAMPION) is None:
        fail(f"{params.data.registered_model_name()} has no champion to serve: run `torchship run` first "
             "(`make pipeline` on a fresh clone), then the demo.")
    quiet_expected_tracebacks()
    with running_demo_service(params) as url:
        traffic = DemoTraffic(url, params)
        console.rule("1. normal traffic")
        console.print(traffic.send(rows // 3, drift=0.0, seed=1001))
        console.print(traffic.send_feedback())
        console.rule(f"2. drifted traffic (data.drift={drift:g})")
        console.print(traffic.send(rows, drift=drift, seed=1002))
        console.print(traffic.send_feedback())
        traffic.wait_logged()
        console.rule("3. monitor → trigger → retrain → bless → register → canary")
        decision = monitor_flow(params_file="params.yaml")
        render_decision(decision)
        console.rule("4. the service now")
        console.print(traffic.health_after_aliases_settle())
    from tasks.core import paths
    from tasks.monitoring.guards import decision_log, last_decisions

    where = decision_log(params.serve, paths.DECISIONS)
    console.print(decisions_table(last_decisions(where, 3), where))
