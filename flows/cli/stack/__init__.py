"""`torchship stack up|down|status|env|restart`: the team stack on loopback (PostgreSQL, moto's S3, MLflow and Prefect
servers, process workers) for trying and testing the team topology; docs/stack.md."""
from __future__ import annotations

import os

import typer
from rich.table import Table

from flows.cli.output import console
from flows.environment import enter_project

stack_app = typer.Typer(help="A team stack on loopback: PostgreSQL, S3 (moto), MLflow and Prefect servers, workers.",
                        no_args_is_help=True)


def status_table(rows) -> Table:
    table = Table("part", "state", "url", "pid", "rss MiB", box=None)
    for row in rows:
        state = "[green]up[/]" if row.up else "[red]down[/]"
        table.add_row(row.name, state, row.url, str(row.pid or "-"), f"{row.rss_mib:.0f}" if row.pid else "-")
    return table


def paths():
    from flows.cli.stack.lifecycle import stack_paths

    return stack_paths(enter_project(), os.environ)


@stack_app.command("up")
def up(workers: int = typer.Option(1, min=0, help="Process workers on the pool torchship-process.")) -> None:
    """Start what is not running (PostgreSQL, moto, MLflow, Prefect, WORKERS workers) and wait until each
    answers. State, logs and the 0600 secrets file live in .stack/ (or TORCHSHIP_STACK_DIR)."""
    import time

    from flows.cli.stack.lifecycle import stack_up

    where, begun = paths(), time.monotonic()
    rows = stack_up(where, workers, os.environ)
    console.print(status_table(rows))
    console.print(f"stack up in {time.monotonic() - begun:.1f} s; state in {where.root}. Point a shell at it: "
                  f'eval "$(torchship stack env)"', highlight=False)


@stack_app.command("down")
def down() -> None:
    """Stop every part, workers first and PostgreSQL last. Data (the databases, the secrets) stays for the next up;
    moto keeps its bucket in memory only, so its objects are gone."""
    from flows.cli.stack.lifecycle import stack_down

    stopped = stack_down(paths(), os.environ)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running.")


@stack_app.command("restart")
def restart(server: str = typer.Argument(..., help="mlflow or prefect.")) -> None:
    """Stop one server and start it again (same port, same store) and wait until it answers: what a team's server
    does when it is upgraded. Its clients retry meanwhile (docs/deploy.md)."""
    from flows.cli.stack.lifecycle import stack_restart

    seconds = stack_restart(paths(), server, os.environ)
    console.print(f"{server} restarted: answering again after {seconds:.1f} s", highlight=False)


@stack_app.command("status")
def status() -> None:
    """Each part: up or down, its URL, PID and resident memory (with its child processes)."""
    from flows.cli.stack.lifecycle import stack_status

    where = paths()
    rows = stack_status(where)
    if not rows:
        console.print(f"no stack in {where.root}: `torchship stack up` starts one.")
        return
    console.print(status_table(rows))


@stack_app.command("env")
def env() -> None:
    """Shell lines that point torchship, MLflow, Prefect and DVC at the stack: eval "$(torchship stack env)".
    Credentials are read from the 0600 secrets file when evaluated, never printed."""
    from flows.cli.stack.lifecycle import shell_env

    typer.echo(shell_env(paths()), nl=False)
