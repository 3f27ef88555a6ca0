"""`torchship run`: the pipeline with overrides, checked and then written where DVC sees them; its summary."""
from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from flows.cli.output import console, err, fail, quiet_expected_tracebacks
from flows.environment import enter_project
from tasks.core.errors import TorchshipError

PARAMS_HELP = "A YAML file of params merged over params.yaml (e.g. a reviewed contract.yaml)."
SET_HELP = "Override a param as section.key=value (repeatable); written into params.yaml so DVC sees it."
COLOURS = {"ran": "green", "pass": "green", "skipped": "dim", "skip": "dim", "fail": "red", "warn": "yellow",
           "run": "yellow", "maybe run": "yellow"}


def run(params: Path = typer.Option(None, "--params", help=PARAMS_HELP),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Run the whole pipeline: the DVC stages (skipped when unchanged), then bless, register and canary.

    Exits 0 when the pipeline ran correctly, blessed or not (the summary says which and why);
    non-zero on errors, with params.yaml put back as it was (also on Ctrl-C or SIGTERM)."""
    params_file = str(params.resolve()) if params else None
    enter_project()
    from flows.pipeline import pipeline  # Prefect is imported only once the environment points into the project
    from tasks.core.procs import Terminated
    from tasks.modalities.sources import check_source
    from tasks.registry.status import registry_changes, registry_snapshot
    from tasks.stages.overrides import applied_overrides, resolve
    from tasks.training.probe_process import check_before_stages
    from tasks.workspace.lock import workspace_lock

    started = time.perf_counter()
    before = None
    try:
        raw, parsed = resolve(set_, params_file)
        check_source(parsed)
        # your own module's probe and the weights' pin, in a child with time and memory limits, before any stage
        check_before_stages(raw, parsed.train.model, parsed.train.pretrained.path)
        # The workspace first: nothing (params.yaml, data/source.json, dvc.lock, data/batches/) is written before
        # this run holds it, so a second run waits or is refused and never changes a running one's inputs.
        with workspace_lock("this run", parsed.retrain.workspace_wait_s):
            before = registry_snapshot(parsed)   # held: what this run finds, not what another is changing
            with applied_overrides(raw):
                quiet_expected_tracebacks()
                summary = pipeline(params_file="params.yaml")
    except TorchshipError as exc:
        # Say what really happened to the registry: a failure after register leaves a version behind.
        registry = (registry_changes(before, registry_snapshot(parsed)) if before is not None
                    else "nothing ran, so nothing was registered or moved")
        fail(f"{exc}\nRegistry: {registry}. params.yaml is as it was before this run.")
    except (KeyboardInterrupt, Terminated):
        registry = registry_changes(before, registry_snapshot(parsed)) if before is not None else "nothing moved"
        err.print(f"stopped: params.yaml is as it was before this run. Registry: {registry}.", highlight=False)
        raise
    render_summary(summary, time.perf_counter() - started)
    # The closing line says what this run did to the registry, not only where the aliases stand now.
    console.print(f"Registry: {registry_changes(before, registry_snapshot(parsed))}.", highlight=False)


def render_summary(summary, seconds: float) -> None:
    """The end-of-run table (tasks.stages.summary.PipelineSummary), the registry outcome and the reports."""
    table = Table(title=f"torchship pipeline · {summary.model_name} · {seconds:.0f}s")
    for column in ("step", "status", "time", "headline"):
        table.add_column(column, overflow="fold")
    for step in summary.steps:
        table.add_row(step.step, f"[{COLOURS.get(step.status, 'cyan')}]{step.status}[/]", f"{step.seconds:.1f}s",
                      step.headline)
    console.print(table)
    aliases = ", ".join(f"{k} → v{v}" for k, v in sorted(summary.aliases.items())) or "none"
    console.print(f"[bold]model[/] {summary.model_name} v{summary.version} · aliases: {aliases}")
    console.print(f"[bold]verdict[/] {summary.verdict}")
    for name, path in summary.reports.items():
        console.print(f"  {name}: {path}")
    console.print("Open the MLflow and Prefect UIs: [bold]torchship ui[/]")


