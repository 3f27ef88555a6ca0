"""The `torchship` command line: one module per command, named after it (a pair of commands that share their code
share a module: status and history, approve and reject; promote, rollback and rebaseline). Each command parses its
arguments, calls one function in tasks/ (or a flow, or the service) and renders the result."""
from __future__ import annotations

from importlib.metadata import version as package_version

import typer
from typer.core import TyperGroup

from flows.cli import (
    approve,
    canary,
    clean,
    config_docs,
    contract,
    demo,
    deploy,
    dvc_deps,
    ingest,
    monitor,
    observability,
    plan,
    predict,
    promote,
    rebuild,
    run,
    serve,
    stack,
    status,
    sweep,
    ui,
)
from flows.cli.output import console, fail
from tasks.core.errors import TorchshipError


class TorchshipGroup(TyperGroup):
    """Any command's TorchshipError becomes one red paragraph and its exit code (2); a bug keeps its traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TorchshipError as exc:
            fail(str(exc), exc.exit_code)


app = typer.Typer(cls=TorchshipGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="torchship: a PyTorch classifier for tables, images or texts, from raw data to a canaried "
                       "service. Run commands from the project folder (the one holding params.yaml).")


def show_version(show: bool) -> None:
    if show:
        console.print(f"torchship {package_version('torchship')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """torchship command line."""


for command in (run.run, plan.plan, ui.ui, serve.serve, status.status, status.history, promote.promote,
                promote.rollback, approve.approve, approve.reject, promote.rebaseline, rebuild.rebuild, clean.clean,
                ingest.ingest, monitor.monitor, deploy.deploy, predict.predict, observability.observability,
                sweep.sweep):
    app.command()(command)
app.command()(canary.canary)
app.add_typer(contract.contract_app, name="contract")
app.add_typer(demo.demo_app, name="demo")
app.add_typer(stack.stack_app, name="stack")
app.command("config-docs", hidden=True)(config_docs.config_docs)
app.command("dvc-deps", hidden=True)(dvc_deps.dvc_deps)



def console_main() -> None:
    """The `torchship` executable: the app, then an exit without unloading every module (a command that ran a
    pipeline holds Prefect, MLflow, torch and pandas: 1-2 CPU-s of teardown after its work is done). In-process
    callers (typer's CliRunner) use `app` itself."""
    import sys

    from tasks.core.procs import exit_without_teardown

    try:
        app()
        code = 0
    except SystemExit as stop:
        code = stop.code
    if isinstance(code, str):   # sys.exit("message"): printed, status 1, as the interpreter does
        print(code, file=sys.stderr)
        code = 1
    exit_without_teardown(code or 0)


__all__ = ["app", "console_main"]
