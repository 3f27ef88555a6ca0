"""`torchship serve`: the model service on 127.0.0.1, following the registry's aliases."""
from __future__ import annotations

import typer

from flows.environment import enter_project


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
