"""`torchship observability`: the Grafana dashboard and Prometheus alert rules for the service, from params."""
from __future__ import annotations

from pathlib import Path

import typer

from flows.cli.output import console
from flows.environment import enter_project


def observability(out: Path = typer.Option(Path("docs/observability"), "--out",
                                           help="Folder to write dashboard.json, alerts.yml and alerts.test.yml "
                                                "into (relative to where you run it).")) -> None:
    """Write the on-call engineer's Grafana dashboard and the Prometheus alert rules derived from the `slo`
    (p99 latency, error rate: page) and `monitor` (drift: ticket) params, with a promtool unit-test file.

    Check them with `promtool check rules alerts.yml` and `promtool test rules alerts.test.yml` (Debian's
    `prometheus` package). Import dashboard.json in Grafana over the Prometheus that scrapes /metrics."""
    out = out.resolve()
    enter_project()
    from serving.observability import observability_files
    from tasks.config import load_params

    params = load_params()
    out.mkdir(parents=True, exist_ok=True)
    for name, content in observability_files(params.slo, params.monitor).items():
        (out / name).write_text(content)
        console.print(f"[green]wrote[/] {out / name}", highlight=False)
