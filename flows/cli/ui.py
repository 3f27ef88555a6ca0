"""`torchship ui`: the MLflow and Prefect UIs (the configured servers when they are remote, else started on
127.0.0.1)."""
from __future__ import annotations

import os

import typer

from flows.cli.output import console
from flows.environment import enter_project


def ui(mlflow_port: int = typer.Option(5000, help="Port of the MLflow UI started here."),
       prefect_port: int = typer.Option(4200, help="Port of the Prefect UI started here."),
       check: bool = typer.Option(False, help="Start what is started here, wait until it answers, print "
                                              "addresses, stop.")) -> None:
    """Open the MLflow UI (runs, registry, model cards) and the Prefect UI (flow runs).

    A configured server is only named: tracking.uri over http(s) for MLflow, PREFECT_API_URL for Prefect (its
    UI, or PREFECT_UI_URL). Otherwise (the embedded default) the UI is started here on 127.0.0.1 and stops
    with this command: Ctrl-C or SIGTERM (logs in .prefect/ui-logs/)."""
    root = enter_project()
    from tasks.config import load_params
    from tasks.core.procs import Terminated, sigterm_raises
    from tasks.workspace.ui import running_servers, serve_until_stopped, ui_servers

    servers = ui_servers(load_params().tracking, mlflow_port, prefect_port, os.environ)
    for server in servers:
        if server.remote:
            console.print(f"[green]remote[/] {server.name:<7} {server.url} (configured; nothing started)",
                          highlight=False)
    started = [server for server in servers if not server.remote]
    if not started:
        return
    what = "both UIs" if len(started) == 2 else f"the {started[0].name} UI"
    try:  # a signal at any moment (even between two prints) stops what was started and says so
        with sigterm_raises(), running_servers(started, root / ".prefect" / "ui-logs", os.environ) as children:
            for server, child in zip(started, children):
                console.print(f"[green]ready[/] {server.name:<7} {server.url} (pid {child.process.pid})",
                              highlight=False)
            if check:
                return
            console.print(f"Press Ctrl-C to stop {what}.")
            serve_until_stopped(children)
    except KeyboardInterrupt:
        how = "Ctrl-C"
    except Terminated:
        how = "SIGTERM"
    console.print(f"stopped {what} ({how}).")
