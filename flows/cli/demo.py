"""`torchship demo drift`: the closed loop acting on the synthetic data (normal, then drifted traffic through a real
service, then the monitor)."""
from __future__ import annotations

import typer

from flows.cli.monitor import decisions_table, render_decision
from flows.cli.output import console, fail, quiet_expected_tracebacks
from flows.environment import enter_project

demo_app = typer.Typer(help="Demonstrations on the synthetic data.", no_args_is_help=True)


@demo_app.command("drift")
def demo_drift(rows: int = typer.Option(2000, help="Rows of drifted traffic (normal traffic: a third of it)."),
               drift: float = typer.Option(0.5, min=0.0, max=1.0, help="The generator's drift knob (data.drift).")
               ) -> None:
    """Show the closed loop act on the synthetic data: serve, send normal then drifted traffic with feedback
    labels, and watch drift report -> trigger -> retrain -> bless -> canary -> promotion or rejection.

    Needs a champion (run `torchship run` first). Every step prints here; the runs show in `torchship ui`."""
    enter_project()
    from flows.monitor import monitor as monitor_flow
    from tasks.config import load_params
    from tasks.monitoring.demo import DemoTraffic, running_demo_service

    params = load_params()
    if params.data.source != "synthetic":
        fail("the drift demo needs data.source=synthetic (its generator has the drift knob); on your own data, "
             "serve real traffic, post labels to /feedback and run `torchship monitor`.")
    from tasks.registry.read import CHAMPION, alias_version, registry_client

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
