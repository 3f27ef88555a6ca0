"""`torchship sweep`: the search (docs/sweep.md): trials, the finalists bless re-judged on the holdout, the winner's
optimism, what happened to the registry."""
from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from flows.cli.output import console, fail, quiet_expected_tracebacks
from flows.cli.run import PARAMS_HELP
from flows.environment import enter_project
from tasks.core.errors import TorchshipError

TRIALS_HELP = "Trials the study holds when it ends (sweep.trials); a study that holds some runs only the rest."
WORKERS_HELP = "Local worker processes, or flow runs on the work pool (sweep.workers)."
SWEEP_SET_HELP = ("Override a param as section.key=value (repeatable), for this sweep: each trial writes its "
                  "own params.yaml; the project's is never changed.")
LOCAL_HELP = "Local processes even when a Prefect server is configured (default there: the sweep-trial deployment)."


def sweep(trials: int = typer.Option(None, "--trials", min=1, help=TRIALS_HELP),
          workers: int = typer.Option(None, "--workers", min=1, help=WORKERS_HELP),
          params: Path = typer.Option(None, "--params", help=PARAMS_HELP),
          set_: list[str] = typer.Option([], "--set", help=SWEEP_SET_HELP),
          local: bool = typer.Option(False, "--local", help=LOCAL_HELP)) -> None:
    """Search the params of sweep.space; each trial trains in a folder of its own, the winner is judged by bless.

    Trial 0 is the live champion's configuration. The top sweep.top_k trials by validation score are re-judged on the
    holdout the search never saw; the first that bless passes is registered and the canary decides. Exits 0 when
    the sweep ran, whether or not a winner passed (the summary says why)."""
    params_file = str(params.resolve()) if params else None
    enter_project()
    from flows.environment import server_configured
    from flows.sweep import sweep as sweep_flow
    from tasks.modalities.sources import check_source
    from tasks.registry.status import registry_changes, registry_snapshot
    from tasks.stages.overrides import resolve

    started = time.perf_counter()
    extra = [f"sweep.trials={trials}"] * (trials is not None) + [f"sweep.workers={workers}"] * (workers is not None)
    try:
        raw, parsed = resolve([*set_, *extra], params_file)
        check_source(parsed)
        check_own_models(raw, parsed)
        before = registry_snapshot(parsed)
        quiet_expected_tracebacks()
        summary = sweep_flow(raw=raw, on_pool=server_configured() and not local)
    except TorchshipError as exc:
        fail(str(exc))
    render(summary, time.perf_counter() - started)
    console.print(f"Registry: {registry_changes(before, registry_snapshot(parsed))}.", highlight=False)


def check_own_models(raw: dict, parsed) -> None:
    """As `torchship run` does before any stage: your own module (the base's, and each `train.model` choice of the
    space naming one) probed in a child with time and memory limits, and pinned weights checked; never in this
    process."""
    from tasks.sweep.space import with_values
    from tasks.training.probe_process import check_before_stages

    searched = parsed.sweep.space.get("train.model")
    choices = [str(m) for m in searched.choices] if searched is not None and searched.choices else []
    for model in dict.fromkeys([parsed.train.model, *choices]):
        if model == parsed.train.model or ":" in model:
            check_before_stages(with_values(raw, {"train.model": model}), model, parsed.train.pretrained.path)


def render(summary, seconds: float) -> None:
    """The trials, the finalists and the verdict."""
    table = Table(title=f"torchship sweep · {summary.study} · {seconds:.0f}s")
    for column in ("trial", "state", f"validation {summary.metric}", "values", "note"):
        table.add_column(column, overflow="fold")
    for row in summary.trials:
        table.add_row(str(row["number"]), row["state"], "" if row["value"] is None else f"{row['value']:.4f}",
                      ", ".join(f"{k}={v}" for k, v in row["values"].items()), row["note"])
    console.print(table)
    for finalist in summary.finalists:
        holdout = "not scored" if finalist.holdout is None else f"holdout {finalist.holdout:.4f}"
        console.print(f"finalist trial {finalist.number}: validation {finalist.validation:.4f}, {holdout}: "
                      f"{finalist.verdict}", highlight=False)
    winner = summary.winner_finalist()
    if winner is not None:
        console.print(f"[bold]winner[/] trial {winner.number}: optimism {winner.optimism:+.4f} (validation minus "
                      "holdout)", highlight=False)
    console.print(f"[bold]verdict[/] {summary.registered}", highlight=False)
    console.print(f"shared work: {summary.shared}", highlight=False)
