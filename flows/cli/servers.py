"""`torchship ui` and `torchship serve`: the MLflow and Prefect UIs, and the model service."""
from __future__ import annotations

import typer

from flows.cli.output import console
from flows.environment import enter_project


def ui(mlflow_port: int = typer.Option(5000, help="Port of the MLflow UI."),
       prefect_port: int = typer.Option(4200, help="Port of the Prefect UI."),
       check: bool = typer.Option(False, help="Start both, wait until they answer, print addresses, stop.")) -> None:
    """Start the MLflow UI (runs, registry, passports) and the Prefect UI (flow runs) on 127.0.0.1.

    Both stop with this command: Ctrl-C or SIGTERM (their logs are in .prefect/ui-logs/)."""
    root = enter_project()
    from tasks.config import load_params
    from tasks.ops.shutdown import Terminated, sigterm_raises
    from tasks.ops.ui import running_servers, serve_until_stopped, ui_servers

    servers = ui_servers(load_params().tracking, mlflow_port, prefect_port)
    try:  # a signal at any moment (even between two prints) stops both servers and says so
        with sigterm_raises(), running_servers(servers, root / ".prefect" / "ui-logs") as children:
            for server, child in zip(servers, children):
                console.print(f"[green]ready[/] {server.name:<7} {server.url} (pid {child.process.pid})",
                              highlight=False)
            if check:
                return
            console.print("Press Ctrl-C to stop both.")
            serve_until_stopped(children)
    except KeyboardInterrupt:
        how = "Ctrl-C"
    except Terminated:
        how = "SIGTERM"
    console.print(f"stopped both UIs ({how}).")


def serve(host: str = typer.Option(None, help="Bind address (default from params: 127.0.0.1)."),
          port: int = typer.Option(None, help="Port (default from params: serve.port)."),
          challenger_share: float = typer.Option(None, help="Share of traffic for the challenger alias."),
          workers: int = typer.Option(None, help="Server processes (default from params: serve.workers).")) -> None:
    """Serve the registered champion (and a challenger share) over HTTP: /predict, /feedback, /health, /ready,
    /metrics, /docs.

    The service follows alias moves in the registry (e.g. a promotion in the MLflow UI) within
    serve.poll_seconds, without dropping requests. Admin endpoints need TORCHSHIP_ADMIN_TOKEN.
    Runs in the foreground until Ctrl-C or SIGTERM."""
    enter_project()
    from serving.__main__ import main as serve_main

    argv = []
    for flag, value in (("--host", host), ("--port", port), ("--challenger-share", challenger_share),
                        ("--workers", workers)):
        if value is not None:
            argv += [flag, str(value)]
    serve_main(argv)
